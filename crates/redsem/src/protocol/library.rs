//! redsem's Redis Functions library: the prelude once, then one function per script, each
//! calling the prelude's `begin` and running the script's body (docs/PROTOCOL.md, "The
//! Functions library").
//!
//! Loaded with `FUNCTION LOAD REPLACE` by the first call that finds it missing on a server
//! (`Function not found`: a new server, a failover to a replica that had not received it yet,
//! a resharded slot, a restart without persistence): on a cluster, to every master at once.
//! Its name and its functions' names carry a hash of its text, so that libraries of several
//! versions live side by side while clients of each run, and a client only ever calls the
//! code it was built with. Where the library cannot be used (Redis before 7.0, `FCALL` or
//! `FUNCTION LOAD` refused by an ACL or a managed service), the client runs the same code as
//! scripts from then on and says so once ([`Library::use_scripts`]).

use redis::Value;

use crate::backend::Conn;
use crate::codes;
use crate::error::{CallError, CallResult};

/// One function of the library: a script as the library needs it.
pub(super) struct Op<'a> {
    /// Its name, after the library's (`<library>_<function>`).
    pub(super) function: &'a str,
    /// Its body: what follows the prelude in its script.
    pub(super) code: &'a str,
    /// Declared `no-writes` (called with `FCALL_RO`).
    pub(super) read_only: bool,
    /// Only removes: `allow-oom`.
    pub(super) allow_oom: bool,
}

/// The library's name and text.
pub(super) struct Library {
    /// `redsem_<12 hex digits of the SHA-1 of its text>`; its functions are
    /// `<name>_<operation>`.
    pub(super) name: String,
    /// The text `FUNCTION LOAD` takes (its first line names it).
    pub(super) text: String,
}

/// Stands for the library's name in its text until the text's hash is known.
const NAME: &str = "@REDSEM_LIBRARY@";

impl Library {
    /// The library of the scripts `ops`: the prelude, then a function per script (`f_<op>`),
    /// then their registration, each with its flags: `no-writes` for a read-only script (run
    /// with `FCALL_RO`), `allow-oom` for those that only remove (release, delete: as scripts,
    /// Redis runs them at `maxmemory`, since their first write frees memory).
    pub(super) fn new(prelude: &str, ops: &[Op<'_>]) -> Library {
        let mut body = format!("{prelude}\n");
        for op in ops {
            body.push_str(&format!(
                "local function f_{f}(KEYS, ARGV)\n{code}\nend\n",
                f = op.function,
                code = op.code
            ));
        }
        for op in ops {
            let flags = if op.read_only {
                ", flags = { 'no-writes' }"
            } else if op.allow_oom {
                ", flags = { 'allow-oom' }"
            } else {
                ""
            };
            body.push_str(&format!(
                "LOADER.register_function{{ function_name = '{NAME}_{f}', callback = f_{f}{flags} }}\n",
                f = op.function
            ));
        }
        let hash = redis::Script::new(&body).get_hash().to_owned();
        let name = format!("redsem_{}", &hash[..12]);
        let text = format!("#!lua name={name}\n{}", body.replace(NAME, &name));
        Library { name, text }
    }
}

impl Library {
    /// Loads the library (on a cluster, on every master). `Ok` also when the library cannot
    /// be used there: the connection then runs the scripts ([`Library::use_scripts`]). `Err`
    /// when the server could not answer.
    pub(super) async fn load(&self, conn: &mut Conn) -> CallResult<()> {
        match self.install(conn).await {
            Ok(_) => {
                tracing::debug!(library = %self.name, "loaded redsem's Functions library");
                Ok(())
            }
            Err(CallError::Redis(e)) if codes::refuses_library(&e) => {
                self.use_scripts(conn, &format!("FUNCTION LOAD failed: {e}"));
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Loads the library (on a cluster, on every master) and returns its name; unlike
    /// [`load`](Self::load), a refusal is an error (for the user that installs the library:
    /// docs/security.md).
    pub(super) async fn install(&self, conn: &mut Conn) -> CallResult<String> {
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&self.text)
            .query_async::<Value>(conn)
            .await
            .map_err(CallError::Redis)?;
        Ok(self.name.clone())
    }

    /// Runs the scripts from now on, on `conn` and its clones; the first caller logs `why`.
    pub(super) fn use_scripts(&self, conn: &Conn, why: &str) {
        if conn.scripting().use_scripts(why) {
            tracing::warn!(
                library = %self.name,
                "redsem's Functions library cannot be used on this Redis ({why}): running its \
                 scripts with EVALSHA instead (the same code; `scripts_only` skips the attempt)"
            );
        }
    }
}
