//! Throwaway TLS certificates (made with rcgen) and TLS-enabled servers.
//!
//! [`TlsCerts::generate`] writes, in a temp dir: a test CA, a server certificate for
//! `127.0.0.1` and `localhost` signed by it, a client certificate signed by it, and a second,
//! unrelated CA with a client certificate of its own (for "untrusted" cases).
//! [`TlsServer`] runs a [`Server`] that also listens for TLS on a second port.
//!
//! ```no_run
//! use test_support::{Flavor, TlsCerts, TlsServer};
//!
//! let certs = TlsCerts::generate();
//! let server = TlsServer::start(Flavor::Redis, &certs, true); // client certificates required
//! println!("{} (CA: {})", server.tls_url(), certs.ca.display());
//! ```

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::{Flavor, PortLease, Server, ServerOptions, reserve_port};

/// PEM files of a throwaway PKI, removed on drop.
#[derive(Debug)]
pub struct TlsCerts {
    dir: tempfile::TempDir,
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// Server certificate (SAN `127.0.0.1`, `localhost`; also good as a client certificate,
    /// for nodes that talk TLS to each other) and key.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// Client certificate (CN `redsem-test-client`) and key, signed by `ca`.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// Another CA, which signed nothing the server trusts.
    pub other_ca: PathBuf,
    /// A client certificate and key signed by `other_ca` (the server rejects it).
    pub other_client_cert: PathBuf,
    pub other_client_key: PathBuf,
}

struct Ca {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().expect("rcgen: key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("rcgen: params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).expect("rcgen: self-signed CA");
    Ca {
        cert_pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A leaf certificate signed by `ca`: (cert PEM, key PEM).
fn leaf(ca: &Ca, cn: &str, sans: &[&str], usage: &[ExtendedKeyUsagePurpose]) -> (String, String) {
    let key = KeyPair::generate().expect("rcgen: key");
    let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .expect("rcgen: params");
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = usage.to_vec();
    let cert = params.signed_by(&key, &ca.issuer).expect("rcgen: sign");
    (cert.pem(), key.serialize_pem())
}

impl TlsCerts {
    pub fn generate() -> TlsCerts {
        let dir = tempfile::Builder::new()
            .prefix("redsem-tls-")
            .tempdir()
            .expect("cannot create a temp dir for certificates");
        let write = |name: &str, pem: &str| -> PathBuf {
            let p = dir.path().join(name);
            std::fs::write(&p, pem).expect("cannot write a PEM file");
            p
        };
        let main = ca("redsem test CA");
        let other = ca("some other CA");
        let (server_cert, server_key) = leaf(
            &main,
            "redsem-test-server",
            &["127.0.0.1", "localhost"],
            // a node is also a client of the others (tls-cluster, tls-replication)
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        let (client_cert, client_key) = leaf(
            &main,
            "redsem-test-client",
            &[],
            &[ExtendedKeyUsagePurpose::ClientAuth],
        );
        let (other_cert, other_key) = leaf(
            &other,
            "intruder",
            &[],
            &[ExtendedKeyUsagePurpose::ClientAuth],
        );
        TlsCerts {
            ca: write("ca.pem", &main.cert_pem),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            other_ca: write("other-ca.pem", &other.cert_pem),
            other_client_cert: write("other-client.pem", &other_cert),
            other_client_key: write("other-client.key", &other_key),
            dir,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Server arguments for TLS on `tls_port` (`--tls-auth-clients yes` when
    /// `require_client_cert`, else `optional`).
    pub fn server_args(&self, tls_port: u16, require_client_cert: bool) -> Vec<String> {
        let p = |p: &Path| p.display().to_string();
        vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            p(&self.server_cert),
            "--tls-key-file".into(),
            p(&self.server_key),
            "--tls-ca-cert-file".into(),
            p(&self.ca),
            "--tls-auth-clients".into(),
            if require_client_cert {
                "yes"
            } else {
                "optional"
            }
            .into(),
        ]
    }
}

/// A [`Server`] that also accepts TLS connections on [`TlsServer::tls_port`]. Its plain port
/// stays open for the test's own checks ([`Server::cmd`]).
pub struct TlsServer {
    server: Server,
    tls: PortLease,
}

impl TlsServer {
    pub fn start(flavor: Flavor, certs: &TlsCerts, require_client_cert: bool) -> TlsServer {
        TlsServer::start_with(flavor, certs, require_client_cert, ServerOptions::default())
    }

    pub fn start_with(
        flavor: Flavor,
        certs: &TlsCerts,
        require_client_cert: bool,
        mut opts: ServerOptions,
    ) -> TlsServer {
        let tls = reserve_port();
        opts.extra_args
            .extend(certs.server_args(tls.port, require_client_cert));
        TlsServer {
            server: Server::start_with(flavor, opts),
            tls,
        }
    }

    pub fn tls_port(&self) -> u16 {
        self.tls.port
    }

    /// `rediss://127.0.0.1:TLSPORT/`
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.tls_port())
    }

    pub fn server(&self) -> &Server {
        &self.server
    }

    pub fn server_mut(&mut self) -> &mut Server {
        &mut self.server
    }
}

impl std::ops::Deref for TlsServer {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.server
    }
}
