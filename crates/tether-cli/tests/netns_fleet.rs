//! Endpoints on separate hosts: each `tether serve` in a network namespace
//! of its own, the PostgreSQL fleet store in a third, joined by veth links
//! (a "store link" from each endpoint's namespace to the database's, and a
//! "control link" from the test's namespace to each endpoint's, so the test
//! still talks to an endpoint whose store link is cut).
//!
//! - A trip on host A cancels a motion on host B, within the bound; the
//!   propagation delay of every trip is read from B's evidence
//!   (`safety.estop.observed`). `TETHER_FLEET_TRIPS=200` makes the figure
//!   run of docs/PERFORMANCE.md (CI: 20 trips).
//! - A cut store link (`ip link set … down`) makes the cut-off endpoint
//!   abort its physical motion and refuse new physical calls within the
//!   governed stop's bound, and it recovers, with nothing lost, when the
//!   link comes back.
//!
//! Needs root (`ip netns`) and Debian's PostgreSQL server binaries, as the
//! other PostgreSQL tests; nothing leaves the machine.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

mod common;

use common::{call_with_token, http_post_with, poll_until, Server, Transport, BIN};
use serde_json::{json, Value};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const ARM: &str = "arm-1";
const AGENT: &str = "netns-agent-token";
const OPERATOR: &str = "netns-operator-token";

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The namespaces of one test, removed (with their links) when dropped.
struct Net {
    db: String,
    hosts: Vec<String>,
    /// The second octet of every address of this net.
    net: u32,
    /// Each host's store-link interface (in the host's namespace).
    store_links: Vec<String>,
    cluster: Option<Cluster>,
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(c) = self.cluster.take() {
            c.stop(&self.db);
        }
        for ns in self.hosts.iter().chain(std::iter::once(&self.db)) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

impl Net {
    /// A database namespace and `hosts` endpoint namespaces.
    fn new(hosts: usize) -> Net {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}{n}", std::process::id() % 100_000);
        let net = 100 + (std::process::id() + n * 7) % 100;
        let db = format!("tdb{tag}");
        let mut this = Net {
            db: db.clone(),
            hosts: Vec::new(),
            net,
            store_links: Vec::new(),
            cluster: None,
        };
        run("ip", &["netns", "add", &db]);
        run("ip", &["-n", &db, "link", "set", "lo", "up"]);
        for i in 1..=hosts {
            let ns = format!("th{i}{tag}");
            run("ip", &["netns", "add", &ns]);
            this.hosts.push(ns.clone());
            run("ip", &["-n", &ns, "link", "set", "lo", "up"]);
            // The store link: host <-> database.
            let (s, d) = (format!("s{i}{tag}"), format!("d{i}{tag}"));
            run(
                "ip",
                &["link", "add", &s, "type", "veth", "peer", "name", &d],
            );
            run("ip", &["link", "set", &s, "netns", &ns]);
            run("ip", &["link", "set", &d, "netns", &db]);
            let db_addr = format!("10.{net}.{i}.1/24");
            let host_addr = format!("10.{net}.{i}.2/24");
            run("ip", &["-n", &db, "addr", "add", &db_addr, "dev", &d]);
            run("ip", &["-n", &db, "link", "set", &d, "up"]);
            run("ip", &["-n", &ns, "addr", "add", &host_addr, "dev", &s]);
            run("ip", &["-n", &ns, "link", "set", &s, "up"]);
            this.store_links.push(s);
            // The control link: the test's namespace <-> host.
            let (c, e) = (format!("c{i}{tag}"), format!("e{i}{tag}"));
            run(
                "ip",
                &["link", "add", &c, "type", "veth", "peer", "name", &e],
            );
            run("ip", &["link", "set", &e, "netns", &ns]);
            let root_addr = format!("10.{net}.{}.1/24", 100 + i);
            let ctl_addr = format!("10.{net}.{}.2/24", 100 + i);
            run("ip", &["addr", "add", &root_addr, "dev", &c]);
            run("ip", &["link", "set", &c, "up"]);
            run("ip", &["-n", &ns, "addr", "add", &ctl_addr, "dev", &e]);
            run("ip", &["-n", &ns, "link", "set", &e, "up"]);
        }
        this.cluster = Some(Cluster::start(&db, net, hosts));
        this
    }

    /// The store URL as host `i` (1-based) reaches it.
    fn store_url(&self, i: usize) -> String {
        format!("postgres://postgres@10.{}.{i}.1:5432/postgres", self.net)
    }

    /// Host `i`'s control address (where its endpoint listens).
    fn control_addr(&self, i: usize) -> String {
        format!("10.{}.{}.2:0", self.net, 100 + i)
    }

    /// Runs `tether args…` in host `i`'s namespace.
    fn tether(&self, i: usize, args: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.hosts[i - 1], BIN])
            .args(args)
            .output()
            .expect("tether in a namespace")
    }

    /// `tether serve` in host `i`'s namespace on the fleet store.
    fn serve(&self, i: usize, state: &Path, extra: &[&str]) -> Server {
        let url = self.store_url(i);
        let addr = self.control_addr(i);
        let mut args: Vec<&OsStr> = vec![
            OsStr::new("--store"),
            OsStr::new(&url),
            OsStr::new("--http"),
            OsStr::new(&addr),
        ];
        args.extend(extra.iter().map(OsStr::new));
        let wrapper = [
            OsStr::new("ip"),
            OsStr::new("netns"),
            OsStr::new("exec"),
            OsStr::new(&self.hosts[i - 1]),
        ];
        Server::start_wrapped(&wrapper, Transport::Http, Some(state), &args, &[])
    }

    /// Cuts (or restores) host `i`'s store link.
    fn store_link(&self, i: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        run(
            "ip",
            &[
                "-n",
                &self.hosts[i - 1],
                "link",
                "set",
                &self.store_links[i - 1],
                state,
            ],
        );
    }
}

/// A PostgreSQL cluster in the database namespace, listening on the store
/// links only.
struct Cluster {
    dir: tempfile::TempDir,
    data: PathBuf,
}

fn pg_bin(name: &str) -> String {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries (Debian's `postgresql` package)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    dirs.sort();
    dirs.pop()
        .expect("initdb")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

impl Cluster {
    fn start(db_ns: &str, net: u32, hosts: usize) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let root = dir.path().to_string_lossy().into_owned();
        run("chmod", &["755", &root]);
        run("chown", &["postgres", &root]);
        let data_s = data.to_string_lossy().into_owned();
        let initdb = pg_bin("initdb");
        run(
            "runuser",
            &[
                "-u",
                "postgres",
                "--",
                &initdb,
                "-D",
                &data_s,
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        let listen: Vec<String> = (1..=hosts).map(|i| format!("10.{net}.{i}.1")).collect();
        let conf = format!(
            "\nlisten_addresses = '{}'\nport = 5432\nunix_socket_directories = '{root}'\nmax_connections = 50\n",
            listen.join(",")
        );
        let mut text = std::fs::read_to_string(data.join("postgresql.conf")).expect("conf");
        text.push_str(&conf);
        std::fs::write(data.join("postgresql.conf"), text).expect("conf");
        let mut hba = std::fs::read_to_string(data.join("pg_hba.conf")).expect("hba");
        hba.push_str(&format!("\nhost all all 10.{net}.0.0/16 trust\n"));
        std::fs::write(data.join("pg_hba.conf"), hba).expect("hba");
        let cluster = Cluster { dir, data };
        cluster.start_again(db_ns);
        cluster
    }

    /// `pg_ctl start` (again, after a crash: the server recovers from its WAL).
    fn start_again(&self, db_ns: &str) {
        let log = self.dir.path().join("log").to_string_lossy().into_owned();
        let data = self.data.to_string_lossy().into_owned();
        let pg_ctl = pg_bin("pg_ctl");
        run(
            "ip",
            &[
                "netns", "exec", db_ns, "runuser", "-u", "postgres", "--", &pg_ctl, "-D", &data,
                "-l", &log, "-w", "start",
            ],
        );
    }

    /// `pg_ctl stop -m immediate`: every server process quits at once, as
    /// in a crash (the next start recovers from the WAL).
    fn stop(&self, db_ns: &str) {
        let data = self.data.to_string_lossy().into_owned();
        let _ = Command::new("ip")
            .args(["netns", "exec", db_ns, "runuser", "-u", "postgres", "--"])
            .args([&pg_bin("pg_ctl"), "-D", &data, "-m", "immediate", "stop"])
            .output();
    }
}

fn migrate(net: &Net) {
    let out = net.tether(1, &["store", "migrate", "--store", &net.store_url(1)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn move_body(sid: &str, id: &str) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.command", "params": {"session_id": sid, "device_id": ARM, "capability_id": "cap.motion.move_to.v1", "input": {"joints": [1.0, 0, 0, 0, 0, 0], "speed": 0.5}, "command_id": id}}).to_string()
}

fn joint0(s: &Server, sid: &str) -> f64 {
    s.read(sid, ARM, "joints")["state"]["positions"][0]
        .as_f64()
        .expect("position")
}

/// The delays the observing endpoint recorded, from the store's evidence:
/// from the trip to its latch and the cancel of its calls.
fn observed_delays(net: &Net) -> Vec<u64> {
    let out = net.tether(2, &["audit", "export", "--store", &net.store_url(2)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "safety.estop.observed")
        .filter_map(|e| e["body"]["cancel_delay_ms"].as_u64())
        .collect()
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A trip on host A latches the arm on host B and cancels B's motion; every
/// trip's propagation is recorded by B (`observed_delay_ms`).
#[test]
fn a_trip_on_one_host_cancels_a_motion_on_another_within_the_bound() {
    let net = Net::new(2);
    migrate(&net);
    let dir = tempfile::tempdir().expect("tempdir");
    // The control links are not loopback: these test hosts serve without
    // principals on them, as an isolated network may.
    let a = net.serve(1, &dir.path().join("a"), &["--insecure-no-auth"]);
    let b = net.serve(2, &dir.path().join("b"), &["--insecure-no-auth"]);

    // B moves; A trips the arm; B's motion ends cancelled.
    let sid = b.session();
    let addr = b.addr();
    let body = move_body(&sid, "netns-move-1");
    let sender = std::thread::spawn(move || {
        http_post_with(addr, body.as_bytes(), Duration::from_secs(30), "")
    });
    poll_until("B's arm to move", Duration::from_secs(10), || {
        joint0(&b, &sid) > 0.0
    });
    let stop = a.call(
        "mhs.safety.estop",
        json!({"device_id": ARM, "reason": "trip on host A"}),
    );
    assert_eq!(stop["result"]["output"]["latched"], true, "{stop}");
    let answer = sender.join().expect("sender").json();
    assert_eq!(answer["result"]["status"], "cancelled", "{answer}");
    assert_eq!(b.status_of(ARM)["latched"], true);

    // More trips, each reset on A (B follows), for the propagation figure.
    let trips: usize = std::env::var("TETHER_FLEET_TRIPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    for n in 1..trips {
        let reset = a.call(
            "mhs.safety.reset",
            json!({"device_id": ARM, "reason": "next trip"}),
        );
        assert_eq!(reset["result"]["status"], "completed", "{reset}");
        poll_until("B to release", Duration::from_secs(10), || {
            b.status_of(ARM)["latched"] == false
        });
        let stop = a.call(
            "mhs.safety.estop",
            json!({"device_id": ARM, "reason": format!("trip {n}")}),
        );
        assert_eq!(stop["result"]["output"]["latched"], true, "{stop}");
        poll_until("B to latch", Duration::from_secs(10), || {
            b.status_of(ARM)["latched"] == true
        });
    }
    // B records its observation of each trip once the store takes it.
    let mut delays = Vec::new();
    poll_until(
        "B's observations on record",
        Duration::from_secs(20),
        || {
            delays = observed_delays(&net);
            delays.len() >= trips
        },
    );
    delays.sort_unstable();
    eprintln!(
        "fleet stop propagation across namespaces (trip on A to latch and cancel on B) over {} trips: p50 {} ms, p99 {} ms, max {} ms",
        delays.len(),
        percentile(&delays, 0.5),
        percentile(&delays, 0.99),
        delays[delays.len() - 1]
    );
    let verify = net.tether(2, &["audit", "verify", "--store", &net.store_url(2)]);
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

/// A host serving the built-in arm and relay as `hardware` devices, with an
/// agent and an operator, under a policy that lets them run (a hardware
/// motion still needs the operator's approval).
fn hardware_config(dir: &Path) -> PathBuf {
    let arm = common::as_hardware(include_str!("../../tether-drivers/cell/arm-1.toml"));
    let relay = common::as_hardware(include_str!("../../tether-drivers/cell/relay-1.toml"))
        .replace(
            "kind = \"time_bounded\"\n",
            "kind = \"time_bounded\"\nmax_duration_ms = 2000\n",
        );
    std::fs::write(dir.join("arm-hw.toml"), arm).expect("arm");
    std::fs::write(dir.join("relay-hw.toml"), relay).expect("relay");
    std::fs::write(
        dir.join("allow.cedar"),
        "permit(principal, action, resource);\n",
    )
    .expect("policy");
    let cfg = dir.join("tether.toml");
    std::fs::write(
        &cfg,
        format!(
            "devices = [\"arm-hw.toml\", \"relay-hw.toml\"]\npolicy = \"allow.cedar\"\n\n[[principals]]\nid = \"planner\"\nkind = \"agent\"\ntoken_sha256 = \"{}\"\n\n[[principals]]\nid = \"olga\"\nkind = \"human\"\nroles = [\"operator\"]\ntoken_sha256 = \"{}\"\n",
            sha256_hex(AGENT),
            sha256_hex(OPERATOR)
        ),
    )
    .expect("config");
    cfg
}

fn result(s: &Server, token: &str, method: &str, params: Value) -> Value {
    let r = call_with_token(s, token, method, params);
    assert!(r.get("error").is_none(), "{method}: {r}");
    r["result"].clone()
}

fn relay_switch(s: &Server, sid: &str) -> Value {
    result(
        s,
        AGENT,
        "mhs.command",
        json!({"session_id": sid, "device_id": "relay-1", "capability_id": "cap.io.relay.v1", "input": {"channel": 0, "on": true}}),
    )
}

/// A cut store link: within the governed stop's bound the cut-off host
/// aborts its physical motion and refuses new physical calls; when the link
/// returns it serves again, and the chain verifies with everything in it.
#[test]
fn a_cut_store_link_aborts_and_refuses_physical_calls_and_the_host_recovers() {
    let net = Net::new(1);
    migrate(&net);
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = hardware_config(dir.path());
    let cfg_s = cfg.to_string_lossy().into_owned();
    let b = net.serve(1, &dir.path().join("b"), &["--config", &cfg_s]);
    let sid = result(&b, AGENT, "mhs.session.open", json!({}))["session_id"]
        .as_str()
        .expect("session")
        .to_owned();
    assert_eq!(relay_switch(&b, &sid)["status"], "completed");

    // An approved motion runs …
    let body = move_body(&sid, "cut-move-1");
    let first = call_with_token(
        &b,
        AGENT,
        "mhs.command",
        serde_json::from_str::<Value>(&body).expect("body")["params"].clone(),
    );
    let approval = first["result"]["error"]["details"]["approval_id"]
        .as_str()
        .unwrap_or_else(|| panic!("held for approval: {first}"))
        .to_owned();
    result(
        &b,
        OPERATOR,
        "mhs.approvals.decide",
        json!({"approval_id": approval, "decision": "approve", "reason": "netns test"}),
    );
    let addr = b.addr();
    let auth = format!("Authorization: Bearer {AGENT}\r\n");
    let sender = std::thread::spawn(move || {
        http_post_with(addr, body.as_bytes(), Duration::from_secs(90), &auth)
    });
    let read = |s: &Server| {
        result(
            s,
            AGENT,
            "mhs.resource.read",
            json!({"session_id": sid, "device_id": ARM, "resource": "joints"}),
        )["state"]["positions"][0]
            .as_f64()
            .expect("position")
    };
    poll_until("the arm to move", Duration::from_secs(10), || {
        read(&b) > 0.0
    });

    // … until the store link is cut: the motion stops within the bound.
    let cut = Instant::now();
    net.store_link(1, false);
    poll_until("the motion to be aborted", Duration::from_secs(5), || {
        result(&b, OPERATOR, "mhs.safety.status", json!({"device_id": ARM}))["devices"][0]
            ["running_operations"]
            .as_array()
            .is_none_or(Vec::is_empty)
    });
    eprintln!(
        "cut store link: motion aborted {:?} after the cut",
        cut.elapsed()
    );
    let here = read(&b);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        read(&b),
        here,
        "the arm stands still while the stop is unreadable"
    );
    assert!(here < 1.0, "the motion did not finish: {here}");
    // New physical calls are refused while the stop cannot be read.
    let refused = relay_switch(&b, &sid);
    assert_eq!(refused["status"], "rejected", "{refused}");
    assert_eq!(
        refused["error"]["details"]["reason"], "stop_unreadable",
        "{refused}"
    );

    // An e-stop asked meanwhile latches here at once, durable later.
    let stop = result(
        &b,
        OPERATOR,
        "mhs.safety.estop",
        json!({"device_id": ARM, "reason": "during the cut"}),
    );
    assert_eq!(stop["output"]["latched"], true, "{stop}");
    assert_eq!(stop["latch_durable"], false, "{stop}");

    // The link returns: the endpoint serves again on its own.
    net.store_link(1, true);
    poll_until("the relay to switch again", Duration::from_secs(60), || {
        relay_switch(&b, &sid)["status"] == "completed"
    });
    let answer = sender.join().expect("sender").json();
    let status = answer["result"]["status"].as_str().unwrap_or("");
    assert!(
        status == "cancelled" || status == "unknown",
        "the cut motion ended {answer}"
    );
    // The e-stop made during the cut is durable now: its latch row is there.
    poll_until(
        "the cut e-stop to be durable",
        Duration::from_secs(30),
        || {
            let out = net.tether(
                1,
                &["fleet", "status", "--json", "--store", &net.store_url(1)],
            );
            let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            doc["latches"].as_array().is_some_and(|l| {
                l.iter()
                    .any(|r| r["device_id"] == ARM && r["latched"] == true)
            })
        },
    );
    let verify = net.tether(1, &["audit", "verify", "--store", &net.store_url(1)]);
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
}

/// One thermostat setpoint with its own id; the answer as received.
fn setpoint(addr: std::net::SocketAddr, sid: &str, id: &str, degc: f64) -> Option<Value> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "mhs.command", "params": {"session_id": sid, "device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": degc}, "command_id": id}}).to_string();
    let r = std::panic::catch_unwind(|| {
        http_post_with(addr, body.as_bytes(), Duration::from_secs(60), "")
    });
    r.ok().map(|r| r.json()["result"].clone())
}

/// The database crashes (every server process quits at once) under load
/// and comes back: no receipt acknowledged to a client is lost, each
/// replays identically, the endpoint takes commands again without a
/// restart, and the chain verifies.
#[test]
fn killing_the_database_mid_load_loses_no_acknowledged_receipt() {
    let mut net = Net::new(1);
    migrate(&net);
    let dir = tempfile::tempdir().expect("tempdir");
    let s = net.serve(1, &dir.path().join("a"), &["--insecure-no-auth"]);
    let sid = s.session();
    let addr = s.addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (sid, stop) = (sid.clone(), std::sync::Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                let mut n = 0u32;
                while !stop.load(Ordering::SeqCst) && n < 5_000 {
                    n += 1;
                    let id = format!("dbkill-{w}-{n}");
                    let degc = 20.0 + f64::from(n % 40);
                    if let Some(r) = setpoint(addr, &sid, &id, degc) {
                        let durable = r["x-tether"]["evidence"] != "not_durable";
                        if r["status"] == "completed" && durable {
                            acked.push((id, r["receipt_id"].clone()));
                        }
                    }
                }
                acked
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let cluster = net.cluster.take().expect("cluster");
    cluster.stop(&net.db);
    std::thread::sleep(Duration::from_millis(1500));
    cluster.start_again(&net.db);
    net.cluster = Some(cluster);
    // Served again without a restart of the endpoint.
    poll_until(
        "a command to complete after the crash",
        Duration::from_secs(60),
        || {
            setpoint(
                addr,
                &sid,
                &format!("after-{}", Instant::now().elapsed().as_nanos()),
                21.0,
            )
            .is_some_and(|r| r["status"] == "completed")
        },
    );
    stop.store(true, Ordering::SeqCst);
    let acked: Vec<(String, Value)> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("worker"))
        .collect();
    assert!(acked.len() > 10, "too little load: {}", acked.len());
    eprintln!(
        "database crash under load: {} receipts acknowledged, each checked",
        acked.len()
    );
    for (id, receipt_id) in &acked {
        let degc: f64 = id
            .rsplit('-')
            .next()
            .and_then(|n| n.parse::<u32>().ok())
            .map_or(0.0, |n| 20.0 + f64::from(n % 40));
        let again = setpoint(addr, &sid, id, degc).expect("replay");
        assert_eq!(again["replayed"], true, "{id}: {again}");
        assert_eq!(&again["receipt_id"], receipt_id, "{id}: {again}");
    }
    let verify = net.tether(1, &["audit", "verify", "--store", &net.store_url(1)]);
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
}
