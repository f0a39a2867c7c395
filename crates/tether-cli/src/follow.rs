//! `tether audit export --follow`: the chain as JSON Lines, then every entry
//! as it commits, for a log pipeline or a SIEM. Each line is the stored
//! entry, which carries its own `hash` and its `prev_hash`, so a receiver
//! checks continuity line by line: a dropped or altered entry breaks the
//! link (the failure this avoids is an export that drops the link, so that
//! deleted records go unnoticed). No seal line: the stream has no end.

use crate::store::{open_for_shell, StoreChoice};
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

/// Entries asked of the store at once.
const PAGE: usize = 1_000;
/// Pause when the chain has nothing new.
const IDLE_POLL: Duration = Duration::from_millis(200);
/// Pause after a failed read before the next (the store may be restarting).
const ERROR_POLL: Duration = Duration::from_secs(1);

/// Prints entries after `after`, then follows the chain until the output
/// closes (exit 0) or Ctrl-C.
pub fn follow(choice: &StoreChoice, after: u64) -> anyhow::Result<ExitCode> {
    let opened = open_for_shell(choice)?;
    let store = &*opened.store;
    eprintln!(
        "tether: following the evidence chain of the {} after seq {after} (Ctrl-C ends)",
        opened.shown
    );
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut last = after;
    let mut said_error = false;
    // Runs until the reader goes away; each round is one bounded page.
    loop {
        let page = match store.entries_after(last, PAGE) {
            Ok(p) => {
                said_error = false;
                p
            }
            Err(e) => {
                if !said_error {
                    eprintln!("tether: reading the chain failed ({e}); trying again");
                    said_error = true;
                }
                std::thread::sleep(ERROR_POLL);
                continue;
            }
        };
        if page.is_empty() {
            std::thread::sleep(IDLE_POLL);
            continue;
        }
        for (seq, line) in &page {
            if seq != &(last + 1) {
                // A gap in the store's own sequence: say so and stop, rather
                // than ship a stream with a hole in it.
                eprintln!("tether: the chain jumps from seq {last} to {seq}; stopping");
                return Ok(ExitCode::from(1));
            }
            if writeln!(out, "{line}").is_err() {
                return Ok(ExitCode::SUCCESS);
            }
            last = *seq;
        }
        if out.flush().is_err() {
            return Ok(ExitCode::SUCCESS);
        }
    }
}
