//! Real protocol peers for the driver tests (issue 18): the pinned Python
//! (pymodbus, paho-mqtt, asyncua from `tests/peers/requirements.txt`, in the
//! `py-peers` virtualenv under the target directory that `.ci/run` fills),
//! Debian's `mosquitto` broker, and free loopback ports. Every wait bounded.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long installing the pinned peers may take on a cold machine.
const SETUP_TIMEOUT: Duration = Duration::from_secs(600);

/// This package's directory.
pub fn package_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory of peer programs and their requirements.
pub fn peers_dir() -> PathBuf {
    package_dir().join("tests/peers")
}

/// The workspace's target directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| {
            if p.is_absolute() {
                p
            } else {
                package_dir().join("../..").join(p)
            }
        })
        .unwrap_or_else(|| package_dir().join("../../target"))
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn run_bounded(what: &str, cmd: &mut Command) -> Result<(), String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    let deadline = Instant::now() + SETUP_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return if status.success() {
                Ok(())
            } else {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                Err(format!("{what} failed ({status}): {err}"))
            };
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            return Err(format!("{what} did not finish within {SETUP_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A Python with the pinned `requirements` installed: `$override_var` when
/// set, else the virtualenv `<target>/<venv_name>` (created, or updated when
/// the pin changed; a stamp file records what is installed). The MCP tests
/// use it too, for the official MCP SDK.
///
/// # Errors
/// No Python on PATH, or venv/pip failing within the setup bound.
pub fn pinned_venv(
    override_var: &str,
    requirements: &Path,
    venv_name: &str,
) -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var(override_var) {
        return Ok(PathBuf::from(p));
    }
    let pinned = std::fs::read_to_string(requirements)
        .map_err(|e| format!("reading {}: {e}", requirements.display()))?;
    let venv = target_dir().join(venv_name);
    let python = venv.join("bin/python");
    let stamp = venv.join("tether-requirements.txt");
    if python.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&pinned) {
        return Ok(python);
    }
    if !python.exists() {
        let base = ["python3.11", "python3"]
            .into_iter()
            .find(|p| {
                Command::new(p)
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .ok_or("no python3 on PATH: install Python 3.10+ (these tests run Python programs)")?;
        run_bounded(
            &format!("creating the virtualenv {venv_name}"),
            Command::new(base).args(["-m", "venv"]).arg(&venv),
        )?;
    }
    run_bounded(
        &format!("pip install -r {}", requirements.display()),
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-q",
                "-r",
            ])
            .arg(requirements),
    )?;
    std::fs::write(&stamp, &pinned).map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    Ok(python)
}

fn setup_python() -> Result<PathBuf, String> {
    pinned_venv(
        "TETHER_PEERS_PYTHON",
        &peers_dir().join("requirements.txt"),
        "py-peers",
    )
}

/// The Python with the pinned peers (set up once per test binary).
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match PYTHON.get_or_init(setup_python) {
        Ok(p) => p,
        Err(e) => panic!(
            "the driver tests need pymodbus, paho-mqtt and asyncua and could not set them up:\n{e}\n\
             (set TETHER_PEERS_PYTHON to a Python with `pip install -r crates/tether-cli/tests/peers/requirements.txt` done)"
        ),
    }
}

/// The mosquitto broker binary (Debian installs it in /usr/sbin, which is
/// not on every PATH).
pub fn mosquitto() -> PathBuf {
    for p in [
        "/usr/sbin/mosquitto",
        "/usr/bin/mosquitto",
        "/usr/local/sbin/mosquitto",
    ] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    panic!("the MQTT driver tests need the mosquitto broker: apt-get install mosquitto")
}

/// A device program (a `examples/*/` peer) running under the pinned
/// Python, with its JSON-lines log, status file and control file in `dir`,
/// named `<name>.log`, `<name>.status`, `<name>.control`. Every example peer
/// takes `--log`, `--status-file` and `--control` and prints `ready <port>`
/// once it serves.
pub struct Peer {
    child: std::process::Child,
    /// The port it serves on.
    pub port: u16,
    /// Where its files are.
    pub dir: PathBuf,
    name: String,
}

impl Peer {
    /// Starts `script` (relative to the repository) with `args`; waits for
    /// its `ready` line.
    pub fn start(script: &str, args: &[String], dir: &Path, name: &str, port: u16) -> Peer {
        let path = package_dir().join("../..").join(script);
        let file = |ext: &str| dir.join(format!("{name}.{ext}"));
        let mut child = Command::new(python())
            .arg(&path)
            .args(args)
            .arg("--log")
            .arg(file("log"))
            .arg("--status-file")
            .arg(file("status"))
            .arg("--control")
            .arg(file("control"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {script}: {e}"));
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("{script} did not say ready"));
        assert!(line.starts_with("ready"), "{script}: {line}");
        Peer {
            child,
            port,
            dir: dir.to_path_buf(),
            name: name.to_owned(),
        }
    }

    /// Every line of its log.
    pub fn lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.join(format!("{}.log", self.name)))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Its logged events named `name`.
    pub fn events(&self, name: &str) -> Vec<serde_json::Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["kind"] == "event" && l["event"] == name)
            .collect()
    }

    /// Its status file (`Null` before the first).
    pub fn status(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.dir.join(format!("{}.status", self.name)))
            .unwrap_or_default();
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }

    /// Replaces its control file; waits for it to be re-read (every 50 ms).
    pub fn control(&self, v: serde_json::Value) {
        let path = self.dir.join(format!("{}.control", self.name));
        let tmp = path.with_extension("control.tmp");
        std::fs::write(&tmp, v.to_string()).expect("write control");
        std::fs::rename(tmp, path).expect("rename control");
        std::thread::sleep(Duration::from_millis(150));
    }

    /// Removes its control file (defaults again on the next start).
    pub fn clear_control(&self) {
        let _ = std::fs::remove_file(self.dir.join(format!("{}.control", self.name)));
    }

    /// Kills it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop();
    }
}
