use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use test_support::{Flavor, Reply, Server, ServerOptions, flavors, server_binary};

fn alive(pid: u32) -> bool {
    // A zombie (dead, not reaped yet) counts as dead.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// Sends an inline command on a raw, unauthenticated connection.
fn raw(server: &Server, line: &str) -> String {
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("{line}\r\n").as_bytes()).unwrap();
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply).unwrap();
    reply.trim_end().to_string()
}

fn info_field(server: &Server, field: &str) -> Option<String> {
    let info = server.cmd(&["INFO", "server"]);
    let text = info.as_str().unwrap().to_string();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")).map(str::to_string))
}

#[test]
fn flavors_display_their_names() {
    assert_eq!(Flavor::Redis.to_string(), "redis");
    assert_eq!(Flavor::Valkey.to_string(), "valkey");
}

#[test]
fn flavors_always_include_redis_and_valkey_when_required() {
    let all = flavors();
    assert_eq!(all[0], Flavor::Redis);
    if std::env::var("REDSEM_REQUIRE_VALKEY").is_ok_and(|v| v == "1") {
        assert!(all.contains(&Flavor::Valkey));
    }
    assert_eq!(
        all.contains(&Flavor::Valkey),
        server_binary(Flavor::Valkey).is_some()
    );
}

#[test]
fn a_started_server_answers_and_is_the_flavor_asked_for() {
    for flavor in flavors() {
        let server = Server::start(flavor);
        assert_eq!(server.flavor(), flavor);
        assert_eq!(
            server.url(),
            format!("redis://127.0.0.1:{}/", server.port())
        );
        assert_eq!(server.cmd(&["PING"]), Reply::Status("PONG".into()));
        assert!(server.cmd(&["SET", "k", "v"]).is_ok());
        assert_eq!(server.cmd(&["GET", "k"]).as_str(), Some("v"));
        assert!(server.cmd(&["GET", "missing"]).is_nil());
        assert_eq!(server.cmd(&["INCRBY", "n", "5"]).as_int(), Some(5));
        assert!(server.cmd(&["NOSUCHCOMMAND"]).is_error());
        assert_eq!(
            info_field(&server, "process_id"),
            Some(server.pid().to_string())
        );
        let is_valkey = info_field(&server, "server_name").as_deref() == Some("valkey");
        assert_eq!(is_valkey, flavor == Flavor::Valkey, "{flavor}");
        if flavor == Flavor::Valkey {
            let version = info_field(&server, "valkey_version").unwrap();
            assert!(version.starts_with("9."), "valkey {version}");
        }
    }
}

#[test]
fn servers_persist_nothing_and_allow_debug() {
    for flavor in flavors() {
        let server = Server::start(flavor);
        let save = server.cmd(&["CONFIG", "GET", "save"]);
        assert_eq!(save.as_array().unwrap()[1].as_str(), Some(""), "{flavor}");
        let aof = server.cmd(&["CONFIG", "GET", "appendonly"]);
        assert_eq!(aof.as_array().unwrap()[1].as_str(), Some("no"), "{flavor}");
        let maxclients = server.cmd(&["CONFIG", "GET", "maxclients"]);
        assert!(maxclients.as_array().unwrap()[1].as_str().is_some());
        assert!(server.cmd(&["DEBUG", "SLEEP", "0"]).is_ok(), "{flavor}");
        assert!(
            server.log().contains("Ready to accept connections"),
            "{flavor}"
        );
    }
}

#[test]
fn debug_can_be_disabled_and_extra_args_are_passed() {
    for flavor in flavors() {
        let opts = ServerOptions {
            enable_debug: false,
            extra_args: vec!["--maxmemory".into(), "12mb".into()],
            ..ServerOptions::default()
        };
        let server = Server::start_with(flavor, opts);
        assert!(server.cmd(&["DEBUG", "SLEEP", "0"]).is_error(), "{flavor}");
        let maxmemory = server.cmd(&["CONFIG", "GET", "maxmemory"]);
        assert_eq!(maxmemory.as_array().unwrap()[1].as_str(), Some("12582912"));
    }
}

#[test]
fn a_server_runs_in_the_callers_process_group_unless_asked_for_its_own() {
    // SAFETY: getpgid(2) only reads.
    let pgid = |pid: u32| unsafe { libc::getpgid(pid as libc::pid_t) };
    let ours = pgid(std::process::id());
    let shared = Server::start(Flavor::Redis);
    assert_eq!(pgid(shared.pid()), ours);
    let own = Server::start_with(
        Flavor::Redis,
        ServerOptions {
            own_process_group: true,
            ..ServerOptions::default()
        },
    );
    assert_eq!(pgid(own.pid()), own.pid() as libc::pid_t);
    assert_ne!(pgid(own.pid()), ours);
    assert_eq!(own.cmd(&["PING"]).as_str(), Some("PONG"));
}

#[test]
fn a_password_protects_the_default_user_and_cmd_authenticates() {
    for flavor in flavors() {
        let opts = ServerOptions {
            password: Some("secret".into()),
            ..ServerOptions::default()
        };
        let server = Server::start_with(flavor, opts);
        assert!(raw(&server, "PING").starts_with("-NOAUTH"), "{flavor}");
        assert_eq!(server.cmd(&["PING"]).as_str(), Some("PONG"));
    }
}

#[test]
fn acl_users_are_loaded_alongside_the_default_password() {
    for flavor in flavors() {
        let opts = ServerOptions {
            acl_users: vec!["user app on >pw ~redsem:* &redsem:* +@all".into()],
            password: Some("secret".into()),
            ..ServerOptions::default()
        };
        let server = Server::start_with(flavor, opts);
        assert!(raw(&server, "PING").starts_with("-NOAUTH"), "{flavor}");
        assert!(
            server
                .cmd_as("app", "pw", &["SET", "redsem:x", "1"])
                .is_ok()
        );
        let denied = server.cmd_as("app", "pw", &["SET", "other", "1"]);
        assert!(denied.as_error().unwrap().starts_with("NOPERM"), "{denied}");
        assert!(server.cmd(&["SET", "other", "1"]).is_ok(), "{flavor}");
    }
}

#[test]
fn a_killed_server_loses_its_data_and_restarts_empty_on_the_same_port() {
    for flavor in flavors() {
        let mut server = Server::start(flavor);
        let (port, pid) = (server.port(), server.pid());
        server.cmd(&["SET", "k", "v"]);
        server.kill();
        assert!(!server.is_running());
        assert!(!alive(pid), "{flavor} pid {pid} survived kill");
        assert!(server.try_cmd(&["PING"]).is_err());
        server.restart();
        assert!(server.is_running());
        assert_eq!(server.port(), port);
        assert_ne!(server.pid(), pid);
        assert!(
            server.cmd(&["GET", "k"]).is_nil(),
            "{flavor} kept data over a kill"
        );
    }
}

#[test]
fn a_running_server_restarts_on_the_same_port() {
    for flavor in flavors() {
        let mut server = Server::start(flavor);
        let (port, pid) = (server.port(), server.pid());
        server.cmd(&["SET", "k", "v"]);
        server.restart();
        assert!(!alive(pid));
        assert_eq!(server.port(), port);
        assert!(server.cmd(&["GET", "k"]).is_nil());
    }
}

#[test]
fn a_stopped_server_exits_cleanly_and_can_restart() {
    for flavor in flavors() {
        let mut server = Server::start(flavor);
        let pid = server.pid();
        server.stop();
        assert!(!alive(pid), "{flavor} pid {pid} survived stop");
        assert!(
            server.log().contains("bye"),
            "{flavor} did not shut down cleanly"
        );
        server.restart();
        assert_eq!(server.cmd(&["PING"]).as_str(), Some("PONG"));
    }
}

#[test]
fn a_paused_server_answers_nothing_until_resumed() {
    for flavor in flavors() {
        let server = Server::start(flavor);
        server.pause();
        thread::scope(|s| {
            let started = Instant::now();
            let ping = s.spawn(|| server.cmd(&["PING"]));
            thread::sleep(Duration::from_millis(300));
            assert!(!ping.is_finished(), "{flavor} answered while paused");
            server.resume();
            assert_eq!(ping.join().unwrap().as_str(), Some("PONG"));
            assert!(started.elapsed() >= Duration::from_millis(300));
        });
    }
}

#[test]
fn a_paused_server_can_be_stopped_and_killed() {
    for flavor in flavors() {
        let mut server = Server::start(flavor);
        server.pause();
        let pid = server.pid();
        server.stop();
        assert!(!alive(pid));
        server.restart();
        server.pause();
        let pid = server.pid();
        server.kill();
        assert!(!alive(pid));
    }
}

#[test]
fn dropping_a_server_kills_its_process_and_removes_its_dir() {
    for flavor in flavors() {
        let server = Server::start(flavor);
        let (pid, dir) = (server.pid(), server.dir().to_path_buf());
        assert!(dir.join("server.log").exists());
        drop(server);
        assert!(!alive(pid), "{flavor} pid {pid} survived drop");
        assert!(!dir.exists());
    }
}

#[test]
fn a_panicking_test_still_kills_its_server() {
    let pid = std::panic::catch_unwind(|| {
        let server = Server::start(Flavor::Redis);
        std::panic::panic_any(server.pid());
    })
    .unwrap_err();
    let pid = *pid.downcast::<u32>().unwrap();
    assert!(!alive(pid));
}

#[test]
fn servers_started_in_parallel_get_distinct_ports() {
    let servers: Vec<Server> = thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| s.spawn(move || Server::start(flavors()[i % flavors().len()])))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ports: Vec<u16> = servers.iter().map(Server::port).collect();
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), servers.len());
    for server in &servers {
        let pid = server.cmd(&["INFO", "server"]);
        assert!(
            pid.as_str()
                .unwrap()
                .contains(&format!("process_id:{}", server.pid()))
        );
    }
}

const ORPHAN_HELPER: &str = "TEST_SUPPORT_ORPHAN_HELPER";

/// Not a test on its own: run by `servers_die_with_a_test_process_that_is_killed` in a child
/// process (through `--ignored`), where it starts a server, prints its pid, and dies without
/// running destructors.
#[test]
#[ignore = "entry point of the child process of servers_die_with_a_test_process_that_is_killed"]
fn helper_process_that_aborts_while_holding_a_server() {
    if std::env::var_os(ORPHAN_HELPER).is_none() {
        return;
    }
    let server = Server::start(Flavor::Redis);
    println!("\nSERVER_PID={}", server.pid());
    println!("SERVER_DIR={}", server.dir().display());
    std::io::stdout().flush().unwrap();
    std::process::abort();
}

#[test]
fn servers_die_with_a_test_process_that_is_killed() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "helper_process_that_aborts_while_holding_a_server",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ORPHAN_HELPER, "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let pid: u32 = stdout
        .lines()
        .find_map(|l| l.split_once("SERVER_PID=").map(|(_, pid)| pid))
        .unwrap_or_else(|| {
            panic!(
                "no pid in {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .parse()
        .unwrap();
    if let Some(dir) = stdout
        .lines()
        .find_map(|l| l.split_once("SERVER_DIR=").map(|(_, dir)| dir))
    {
        let _ = std::fs::remove_dir_all(dir);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "server {pid} outlived its test process"
        );
        thread::sleep(Duration::from_millis(20));
    }
}
