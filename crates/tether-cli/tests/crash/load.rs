//! The mixed load of one cycle: four threads, each with its own seeded RNG,
//! running until the endpoint is killed under them — the thermostat (budget
//! draws, holds with two votes and their resumption), the relay bank, the
//! arm (motions of up to ~3 s, so kills land inside them) and the safety
//! operator (e-stops and resets). Every step is reported as an `Event`.

use super::client::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::time::Duration;

pub const DEVICES: [&str; 3] = ["thermostat-1", "arm-1", "relay-1"];

/// What every load thread shares.
pub struct Ctx<'a> {
    pub addr: SocketAddr,
    pub stop: &'a AtomicBool,
    pub tx: Sender<Event>,
    pub cycle: u64,
    pub seed: u64,
}

impl Ctx<'_> {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn emit(&self, e: Event) {
        let _ = self.tx.send(e);
    }

    /// Sends `via` and reports it; answers the receipt when there was one.
    fn command(&self, sid: &str, cid: &str, via: Via, motion: bool, draw: bool) -> Option<Value> {
        self.emit(Event::Sending {
            cid: cid.to_owned(),
            via: via.clone(),
            motion,
        });
        match send(self.addr, sid, &via) {
            Sent::Receipt(r) => {
                if r["error"]["mhs_code"] == "MHS.PROTOCOL.INTERNAL" {
                    self.emit(Event::Anomaly(format!("{cid}: {r}")));
                }
                if r["status"] == "rejected" {
                    self.emit(Event::Refusal(
                        r["error"]["mhs_code"].as_str().unwrap_or("?").to_owned(),
                    ));
                }
                self.emit(Event::Answered {
                    cid: cid.to_owned(),
                    via,
                    receipt: r.clone(),
                    draw,
                });
                Some(r)
            }
            Sent::Refused(code) => {
                if code.contains("INTERNAL") {
                    self.emit(Event::Anomaly(format!("{cid}: {code}")));
                }
                self.emit(Event::Refusal(code));
                self.emit(Event::Unanswered {
                    cid: cid.to_owned(),
                    refused: true,
                });
                None
            }
            Sent::Unreached => {
                self.emit(Event::Unanswered {
                    cid: cid.to_owned(),
                    refused: true,
                });
                None
            }
            Sent::Lost(_) => {
                self.emit(Event::Unanswered {
                    cid: cid.to_owned(),
                    refused: false,
                });
                None
            }
        }
    }
}

/// Runs the four load threads until `ctx.stop`; each thread ends at its
/// first request after the stop.
pub fn run(ctx: &Ctx<'_>) {
    std::thread::scope(|s| {
        let workers: [fn(&Ctx<'_>, &mut StdRng); 4] = [thermostat, relay, arm, safety];
        for (i, w) in workers.into_iter().enumerate() {
            let mut rng = StdRng::seed_from_u64(ctx.seed ^ (ctx.cycle << 8) ^ (i as u64 + 1));
            s.spawn(move || w(ctx, &mut rng));
        }
    });
}

/// A session, retried until the stop (the endpoint may be busy starting).
fn session_until_stop(ctx: &Ctx<'_>, token: &str) -> Option<String> {
    while !ctx.stopped() {
        if let Ok(s) = session(ctx.addr, token) {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

fn pick_via(rng: &mut StdRng, params: Value, tool: &str) -> Via {
    if rng.gen_bool(0.3) {
        Via::Rest {
            tool: tool.to_owned(),
            body: json!({"input": params["input"], "command_id": params["command_id"]}),
        }
    } else {
        Via::Rpc(params)
    }
}

/// Setpoints: most below the hold's threshold (each draws the budget), one
/// in five above it, held for two operators and resumed.
fn thermostat(ctx: &Ctx<'_>, rng: &mut StdRng) {
    let Some(sid) = session_until_stop(ctx, AGENT) else {
        return;
    };
    let mut n = 0u64;
    while !ctx.stopped() {
        n += 1;
        let cid = format!("k{}-t{n}", ctx.cycle);
        let hot = rng.gen_bool(0.2);
        let t: f64 = if hot {
            f64::from(rng.gen_range(61..=90))
        } else {
            f64::from(rng.gen_range(10..=60))
        };
        let params = json!({"device_id": "thermostat-1", "capability_id": "cap.thermal.setpoint.v1", "input": {"target_temperature": t}, "command_id": cid});
        let via = if hot {
            Via::Rpc(params)
        } else {
            pick_via(rng, params, "thermostat-1__setpoint")
        };
        let Some(r) = ctx.command(&sid, &cid, via.clone(), false, true) else {
            continue;
        };
        if r["error"]["mhs_code"] == "MHS.POLICY.HELD" {
            hold_flow(ctx, rng, &sid, &cid, via, &r);
        }
    }
}

/// Two votes on a held setpoint (now and then a denial), then its resend.
fn hold_flow(ctx: &Ctx<'_>, rng: &mut StdRng, sid: &str, cid: &str, via: Via, held: &Value) {
    let Some(id) = held["error"]["details"]["approval_id"].as_str() else {
        ctx.emit(Event::Anomaly(format!(
            "a hold without approval_id: {held}"
        )));
        return;
    };
    ctx.emit(Event::Held {
        approval_id: id.to_owned(),
        cid: cid.to_owned(),
    });
    let deny = rng.gen_bool(0.1);
    for (voter, token) in [("alice", ALICE), ("bob", BOB)] {
        let decision = if deny && voter == "bob" {
            "deny"
        } else {
            "approve"
        };
        let a = rpc(
            ctx.addr,
            token,
            "mhs.approvals.decide",
            json!({"approval_id": id, "decision": decision, "reason": "crash campaign"}),
        );
        match a {
            Ok(a) if a["result"].is_object() => ctx.emit(Event::Voted {
                approval_id: id.to_owned(),
                voter,
            }),
            Ok(a) => {
                ctx.emit(Event::Refusal(code_of_rpc(&a)));
                return;
            }
            Err(_) => return,
        }
    }
    if !deny {
        ctx.command(sid, cid, via, false, true);
    }
}

fn code_of_rpc(a: &Value) -> String {
    a["error"]["data"]["mhs_code"]
        .as_str()
        .unwrap_or("no_code")
        .to_owned()
}

fn relay(ctx: &Ctx<'_>, rng: &mut StdRng) {
    let Some(sid) = session_until_stop(ctx, AGENT) else {
        return;
    };
    let mut n = 0u64;
    while !ctx.stopped() {
        n += 1;
        let cid = format!("k{}-r{n}", ctx.cycle);
        let params = json!({"device_id": "relay-1", "capability_id": "cap.io.relay.v1", "input": {"channel": rng.gen_range(0..4), "on": rng.gen_bool(0.5)}, "command_id": cid});
        let via = pick_via(rng, params, "relay-1__relay");
        ctx.command(&sid, &cid, via, false, false);
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..20)));
    }
}

/// Motions of 0.05–3 s to random joint targets.
fn arm(ctx: &Ctx<'_>, rng: &mut StdRng) {
    let Some(sid) = session_until_stop(ctx, AGENT) else {
        return;
    };
    let mut n = 0u64;
    while !ctx.stopped() {
        n += 1;
        let cid = format!("k{}-a{n}", ctx.cycle);
        let joints: Vec<f64> = (0..6)
            .map(|_| f64::from(rng.gen_range(-150..=150)) / 100.0)
            .collect();
        let speed = f64::from(rng.gen_range(5..=15)) / 10.0;
        let params = json!({"device_id": "arm-1", "capability_id": "cap.motion.move_to.v1", "input": {"joints": joints, "speed": speed}, "command_id": cid});
        let via = pick_via(rng, params, "arm-1__move_to");
        ctx.command(&sid, &cid, via, true, false);
    }
}

/// Resets whatever a previous cycle left latched, then e-stops a device
/// (now and then every device) and resets it a little later.
fn safety(ctx: &Ctx<'_>, rng: &mut StdRng) {
    for d in DEVICES {
        if ctx.stopped() || !reset(ctx, d) {
            return;
        }
    }
    while !ctx.stopped() {
        std::thread::sleep(Duration::from_millis(rng.gen_range(100..600)));
        let all = rng.gen_bool(0.15);
        let devices: Vec<&'static str> = if all {
            DEVICES.to_vec()
        } else {
            vec![DEVICES[rng.gen_range(0..DEVICES.len())]]
        };
        ctx.emit(Event::SafetySending {
            devices: devices.clone(),
        });
        let answer = if !all && rng.gen_bool(0.3) {
            estop_rest(ctx, devices[0])
        } else {
            let params = if all {
                json!({"reason": "crash campaign"})
            } else {
                json!({"device_id": devices[0], "reason": "crash campaign"})
            };
            rpc(ctx.addr, AGENT, "mhs.safety.estop", params).map(|a| a["result"].clone())
        };
        match answer {
            Ok(r) if r["latch_durable"] == true => ctx.emit(Event::SafetyAnswered {
                devices: devices.clone(),
                latched: true,
            }),
            // Answered, but the latch's durability is not acknowledged: the
            // ledger keeps these devices ambiguous.
            Ok(_) => {}
            Err(_) => return,
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(20..300)));
        for d in devices {
            if ctx.stopped() || !reset(ctx, d) {
                return;
            }
        }
    }
}

fn estop_rest(ctx: &Ctx<'_>, device: &str) -> Result<Value, String> {
    let body = json!({"input": {"device_id": device}});
    let (status, v) = http(ctx.addr, "POST", "/tools/estop:invoke", Some(&body), AGENT)?;
    if status != 200 {
        return Err(format!("REST e-stop answered {status}: {v}"));
    }
    Ok(v["data"]["receipt"].clone())
}

/// An operator's reset of `device`; false when the endpoint is gone.
fn reset(ctx: &Ctx<'_>, device: &'static str) -> bool {
    ctx.emit(Event::SafetySending {
        devices: vec![device],
    });
    match rpc(
        ctx.addr,
        ALICE,
        "mhs.safety.reset",
        json!({"device_id": device}),
    ) {
        Ok(a) => {
            let r = &a["result"];
            // Released, or answered as not latched: either way the device
            // is not latched now.
            let released = r["status"] == "completed" && r["output"]["latched"] == false;
            if released || r["error"]["details"]["reason"] == "not_latched" {
                ctx.emit(Event::SafetyAnswered {
                    devices: vec![device],
                    latched: false,
                });
            }
            true
        }
        Err(_) => false,
    }
}
