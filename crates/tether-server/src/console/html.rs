//! The console's pages, rendered on the server: plain HTML that works with
//! scripts off (every action is a form post), which `console.js` makes live
//! (server-sent fragments replace `data-live` regions).
//!
//! **Owns:** escaping (every value from the kernel or a caller is escaped
//! here, nowhere else), the layout with the e-stop on every page, and one
//! renderer per page or fragment.
//! **Never here:** deciding anything, fetching anything: renderers take the
//! JSON the kernel answered and return text.

use serde_json::Value;
use std::fmt::Write as _;

/// Text safe inside an element or a quoted attribute.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A JSON value as short text (strings bare, the rest as JSON), escaped.
pub fn val(v: &Value) -> String {
    match v {
        Value::Null => "—".to_owned(),
        Value::String(s) => esc(s),
        // Numbers as the chain writes them (`5`, not `5.0`), whichever way
        // the value was built.
        Value::Number(_) => esc(&tether_core::canonical::to_canonical_string(v)),
        other => esc(&other.to_string()),
    }
}

/// Milliseconds since the epoch as `YYYY-MM-DD hh:mm:ss UTC` (civil date
/// from days, Howard Hinnant's algorithm); `—` when absent.
pub fn utc(ms: &Value) -> String {
    let Some(ms) = ms.as_u64() else {
        return "—".to_owned();
    };
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = i64::try_from(days).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Who is signed in, as the layout shows it.
pub struct Viewer<'a> {
    /// Principal id.
    pub id: &'a str,
    /// human, agent or service.
    pub kind: &'a str,
    /// Holds the operator role.
    pub operator: bool,
    /// No principals are configured: the single local caller.
    pub local: bool,
    /// The session's CSRF token, carried by every form.
    pub csrf: &'a str,
}

/// The hidden CSRF field of a form.
pub fn csrf_field(v: &Viewer<'_>) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(v.csrf)
    )
}

/// The e-stop form: all devices, or one.
pub fn estop_form(v: &Viewer<'_>, device: Option<&str>) -> String {
    let (label, field) = match device {
        Some(d) => (
            format!("E-STOP {}", esc(d)),
            format!(
                "<input type=\"hidden\" name=\"device_id\" value=\"{}\">",
                esc(d)
            ),
        ),
        None => ("E-STOP all devices".to_owned(), String::new()),
    };
    format!(
        "<form class=\"estop\" method=\"post\" action=\"/console/estop\">{}{field}\
         <input type=\"hidden\" name=\"reason\" value=\"e-stop from the operator console\">\
         <button type=\"submit\" class=\"estop-button\" aria-label=\"{label}\">{label}</button></form>",
        csrf_field(v)
    )
}

/// A whole page: header, who is signed in, navigation, the e-stop, `body`.
pub fn layout(title: &str, v: &Viewer<'_>, body: &str, notice: Option<&str>) -> String {
    let who = if v.local {
        "the single local caller (no principals are configured: anyone who reaches this endpoint acts as it)".to_owned()
    } else {
        format!(
            "{} ({}{})",
            esc(v.id),
            esc(v.kind),
            if v.operator { ", operator" } else { "" }
        )
    };
    let notice = notice
        .map(|n| format!("<p class=\"notice\" role=\"status\">{}</p>", esc(n)))
        .unwrap_or_default();
    let signout = if v.local {
        String::new()
    } else {
        format!(
            "<form method=\"post\" action=\"/console/logout\">{}<button type=\"submit\">Sign out</button></form>",
            csrf_field(v)
        )
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} — Tether console</title>\
         <link rel=\"stylesheet\" href=\"/console/static/console.css\">\
         <script src=\"/console/static/console.js\" defer></script></head><body>\
         <a class=\"skip\" href=\"#main\">Skip to the page's content</a>\
         <header><h1>Tether console</h1>\
         <p class=\"who\">Signed in as <strong id=\"who\">{who}</strong></p>{signout}\
         <nav aria-label=\"Console\"><a href=\"/console/\">Devices</a> <a href=\"/console/approvals\">Approvals</a> <a href=\"/console/evidence\">Evidence</a></nav>\
         {estop}</header>\
         <p class=\"envelope\">Tether is a software envelope, not a safety-rated channel: this e-stop never replaces the hardware emergency stop.</p>\
         {notice}<main id=\"main\" tabindex=\"-1\"><h2>{title}</h2>{body}</main></body></html>",
        title = esc(title),
        estop = estop_form(v, None),
    )
}

/// The sign-in page.
pub fn login(error: Option<&str>) -> String {
    let error = error
        .map(|e| format!("<p class=\"notice\" role=\"alert\">{}</p>", esc(e)))
        .unwrap_or_default();
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Sign in — Tether console</title>\
         <link rel=\"stylesheet\" href=\"/console/static/console.css\"></head><body>\
         <header><h1>Tether console</h1></header>\
         <p class=\"envelope\">Tether is a software envelope, not a safety-rated channel: keep the hardware emergency stop within reach.</p>\
         <main><h2>Sign in</h2>{error}\
         <form method=\"post\" action=\"/console/login\">\
         <label for=\"token\">Your token</label> \
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required> \
         <button type=\"submit\">Sign in</button></form>\
         <p>An e-stop needs no console: <code>tether estop</code> from a shell, or <code>mhs.safety.estop</code> on <code>/rpc</code>.</p>\
         </main></body></html>"
    )
}

fn interlocks_text(d: &Value) -> String {
    d["interlocks"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|i| format!("{}: {}", val(&i["id"]), val(&i["state"])))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "none".to_owned())
}

fn state_text(state: Option<&Value>) -> String {
    match state {
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| format!("{}={}", esc(k), val(v)))
            .collect::<Vec<_>>()
            .join(" "),
        Some(other) => val(other),
        None => "unknown".to_owned(),
    }
}

/// The devices table: one row per device of `mhs.safety.status`, with its
/// live state (`states`: device id → state, absent when unreadable).
pub fn devices_fragment(status: &Value, states: &serde_json::Map<String, Value>) -> String {
    let mut rows = String::new();
    for d in status["devices"].as_array().into_iter().flatten() {
        let id = d["device_id"].as_str().unwrap_or_default();
        let latched = d["latched"] == Value::Bool(true);
        let latch = if latched {
            format!(
                "<strong class=\"latched\">LATCHED</strong> {}",
                val(&d["latch"]["reason"])
            )
        } else {
            "clear".to_owned()
        };
        let _ = write!(
            rows,
            "<tr data-device=\"{id_a}\"><td><a href=\"/console/devices/{id_a}\">{id_t}</a></td><td>{mode}</td>\
             <td>{risk}</td><td class=\"latch\">{latch}</td><td>{armed}</td><td>{interlocks}</td>\
             <td>{running}</td><td class=\"state\">{state}</td></tr>",
            id_a = esc(id),
            id_t = esc(id),
            mode = val(&d["mode"]),
            risk = val(&d["risk_class"]),
            armed = val(&d["armed"]),
            interlocks = interlocks_text(d),
            running = d["running_operations"].as_array().map_or(0, Vec::len),
            state = state_text(states.get(id)),
        );
    }
    format!(
        "<table><caption>Devices (live)</caption><thead><tr><th scope=\"col\">Device</th><th scope=\"col\">Mode</th>\
         <th scope=\"col\">Risk</th><th scope=\"col\">Latch</th><th scope=\"col\">Armed</th><th scope=\"col\">Interlocks</th>\
         <th scope=\"col\">Running</th><th scope=\"col\">State</th></tr></thead><tbody>{rows}</tbody></table>"
    )
}

/// One approval as a block: everything an operator decides on.
fn approval_block(a: &Value, v: &Viewer<'_>) -> String {
    let id = a["approval_id"].as_str().unwrap_or_default();
    let pending = a["status"] == "pending";
    let own = a["requested_by"]["id"].as_str() == Some(v.id);
    let mut input = String::new();
    if let Some(m) = a["input"].as_object() {
        for (k, x) in m {
            let lim = &a["limits"]["limits"][k];
            let range = if lim.is_null() {
                "no declared limit".to_owned()
            } else {
                format!(
                    "limits {}–{} {}",
                    val(&lim["min"]),
                    val(&lim["max"]),
                    val(&lim["unit"])
                )
            };
            let unit = lim["unit"]
                .as_str()
                .map(|u| format!(" {}", esc(u)))
                .unwrap_or_default();
            let _ = write!(
                input,
                "<li><code>{}</code> = <strong>{}{unit}</strong> ({range})</li>",
                esc(k),
                val(x)
            );
        }
    }
    let votes: Vec<String> = a["votes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| {
            format!(
                "{} {} ({})",
                val(&x["by"]),
                val(&x["decision"]),
                val(&x["reason"])
            )
        })
        .collect();
    let buttons = if pending && v.operator && !own {
        format!(
            "<form method=\"post\" action=\"/console/approvals/decide\">{csrf}\
             <input type=\"hidden\" name=\"approval_id\" value=\"{id}\">\
             <label for=\"reason-{id}\">Reason</label> <input id=\"reason-{id}\" name=\"reason\" required> \
             <button type=\"submit\" name=\"decision\" value=\"approve\">Approve</button> \
             <button type=\"submit\" name=\"decision\" value=\"deny\">Deny</button></form>",
            csrf = csrf_field(v),
            id = esc(id)
        )
    } else if pending && own {
        "<p>You asked for this: another operator decides.</p>".to_owned()
    } else {
        String::new()
    };
    format!(
        "<article class=\"approval\" id=\"{id_a}\" data-approval=\"{id_a}\"><h3>{id_t} — {status}</h3>\
         <p>{device} · {capability} · resource {resource} · mode {mode} · risk {risk} · {kind}</p>\
         <p>Asked by {who} ({who_kind}) in session {session}; command <code>{command}</code></p>\
         <ul>{input}</ul><p>Why held: {reason} (policies: {policies})</p>\
         <p>Quorum {quorum}: {approvals} approved so far. Votes: {votes}. Expires {expires}.</p>{buttons}</article>",
        id_a = esc(id),
        id_t = esc(id),
        status = val(&a["status"]),
        device = val(&a["device_id"]),
        capability = val(&a["capability_id"]),
        resource = val(&a["resource"]),
        mode = val(&a["mode"]),
        risk = val(&a["risk"]),
        kind = val(&a["command_kind"]),
        who = val(&a["requested_by"]["id"]),
        who_kind = val(&a["requested_by"]["kind"]),
        session = val(&a["session_id"]),
        command = val(&a["command_id"]),
        reason = val(&a["reason"]),
        policies = val(&a["policies"]),
        quorum = val(&a["quorum"]),
        approvals = val(&a["approvals"]),
        votes = if votes.is_empty() { "none".to_owned() } else { votes.join("; ") },
        expires = utc(&a["expires_at_ms"]),
    )
}

/// The approvals: pending first (with the buttons an operator may use),
/// then the decided and expired ones.
pub fn approvals_fragment(list: &Value, v: &Viewer<'_>) -> String {
    let all: Vec<&Value> = list["approvals"].as_array().into_iter().flatten().collect();
    let (pending, done): (Vec<&Value>, Vec<&Value>) =
        all.into_iter().partition(|a| a["status"] == "pending");
    let block = |xs: &[&Value]| xs.iter().map(|a| approval_block(a, v)).collect::<String>();
    let pending_html = if pending.is_empty() {
        "<p>No approval is waiting.</p>".to_owned()
    } else {
        block(&pending)
    };
    format!(
        "<section aria-labelledby=\"pending\"><h3 id=\"pending\">Pending ({})</h3>{pending_html}</section>\
         <section aria-labelledby=\"history\"><h3 id=\"history\">History</h3>{}</section>",
        pending.len(),
        block(&done)
    )
}

/// A device's own page: its status, reference (limits with units and
/// sources), its e-stop, reset and arming forms.
pub fn device_page(device: &Value, status: &Value, v: &Viewer<'_>) -> String {
    let id = device["device"]["device_id"]
        .as_str()
        .or_else(|| device["reference"]["device_id"].as_str())
        .unwrap_or_default();
    let reference = serde_json::to_string_pretty(&device["reference"]).unwrap_or_default();
    let reason_form = |action: &str, label: &str| {
        format!(
            "<form method=\"post\" action=\"/console/{action}\">{}\
             <input type=\"hidden\" name=\"device_id\" value=\"{id}\">\
             <label for=\"{action}-reason\">Reason</label> <input id=\"{action}-reason\" name=\"reason\" required> \
             <button type=\"submit\">{label}</button></form>",
            csrf_field(v),
            id = esc(id)
        )
    };
    format!(
        "<section data-device=\"{id_a}\">{status}</section>{estop}\
         <h3>Reset the latch</h3>{reset}<h3>Arming (hardware and hybrid devices)</h3>{arm}{disarm}\
         <h3>Reference: limits with units and sources</h3><pre>{reference}</pre>",
        id_a = esc(id),
        status = devices_fragment(status, &serde_json::Map::new()),
        estop = estop_form(v, Some(id)),
        reset = reason_form("reset", "Reset"),
        arm = reason_form("arm", "Arm"),
        disarm = reason_form("disarm", "Disarm"),
        reference = esc(&reference),
    )
}

/// The chain's newest entries, newest first: each entry's position, time,
/// kind, device, command and outcome.
pub fn evidence_fragment(entries: &[Value]) -> String {
    let mut rows = String::new();
    for e in entries.iter().rev() {
        let b = &e["body"];
        let r = &b["receipt"];
        let pick = |k: &str| {
            if b[k].is_null() {
                val(&r[k])
            } else {
                val(&b[k])
            }
        };
        let outcome = if r["status"].is_null() {
            val(&b["outcome"])
        } else {
            val(&r["status"])
        };
        let _ = write!(
            rows,
            "<tr data-seq=\"{seq}\"><td>{seq}</td><td>{at}</td><td>{kind}</td><td>{device}</td><td>{command}</td><td>{outcome}</td></tr>",
            seq = val(&e["seq"]),
            at = utc(&e["ts_ms"]),
            kind = val(&e["kind"]),
            device = pick("device_id"),
            command = pick("command_id"),
        );
    }
    format!(
        "<table><caption>Newest evidence entries (live)</caption><thead><tr><th scope=\"col\">Seq</th><th scope=\"col\">Time</th>\
         <th scope=\"col\">Kind</th><th scope=\"col\">Device</th><th scope=\"col\">Command</th><th scope=\"col\">Outcome</th></tr></thead>\
         <tbody>{rows}</tbody></table>"
    )
}

/// The evidence page: verification (when asked), the live tail, the export.
pub fn evidence_page(tail: &str, verified: Option<&Value>) -> String {
    let verdict = match verified {
        None => String::new(),
        Some(v) if v["ok"] == Value::Bool(true) => format!(
            "<p class=\"notice\" role=\"status\" id=\"verdict\">The whole chain verifies: {} entries, every hash and link intact.</p>",
            val(&v["entries"])
        ),
        Some(v) if v["ok"] == Value::Bool(false) => format!(
            "<p class=\"notice\" role=\"alert\" id=\"verdict\">The chain is BROKEN after {} intact entries: entry {} ({}).</p>",
            val(&v["entries"]),
            val(&v["first_broken"]["seq"]),
            val(&v["first_broken"]["reason"])
        ),
        Some(v) => format!(
            "<p class=\"notice\" role=\"alert\" id=\"verdict\">The chain could not be verified: {}</p>",
            val(&v["error"])
        ),
    };
    format!(
        "{verdict}<form method=\"get\" action=\"/console/evidence/verify\"><button type=\"submit\">Verify the whole chain</button></form> \
         <p><a href=\"/console/evidence/export\" download>Download the export (JSON Lines, sealed; <code>tether audit verify --file</code> checks it)</a></p>\
         <section data-live=\"evidence\">{tail}</section>"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn viewer() -> Viewer<'static> {
        Viewer {
            id: "alice",
            kind: "human",
            operator: true,
            local: false,
            csrf: "c<s>rf",
        }
    }

    #[test]
    fn everything_from_outside_is_escaped() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        let page = layout("<t>", &viewer(), "", Some("<n>"));
        assert!(!page.contains("<t>") && !page.contains("<n>") && !page.contains("c<s>rf"));
        assert!(page.contains("E-STOP all devices"));
    }

    #[test]
    fn numbers_read_as_the_chain_writes_them() {
        assert_eq!(val(&json!(5.0)), "5");
        assert_eq!(val(&json!(72.5)), "72.5");
        assert_eq!(val(&json!(-0.0)), "0");
        assert_eq!(val(&json!(90)), "90");
    }

    #[test]
    fn times_read_as_utc() {
        assert_eq!(utc(&json!(0)), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(&json!(1_796_146_063_871u64)), "2026-12-01 17:27:43 UTC");
        assert_eq!(utc(&json!(951_782_400_000u64)), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(&Value::Null), "—");
    }

    #[test]
    fn the_requester_and_non_operators_get_no_buttons() {
        let a = json!({"approval_id": "appr_1", "status": "pending", "requested_by": {"id": "alice", "kind": "human"}, "input": {"t": 70}, "limits": {"limits": {"t": {"min": 5, "max": 90, "unit": "degC"}}}});
        let mine = approvals_fragment(&json!({"approvals": [a]}), &viewer());
        assert!(!mine.contains("Approve") && mine.contains("another operator decides"));
        assert!(mine.contains("limits 5–90 degC"), "{mine}");
        let agent = Viewer {
            id: "bot",
            kind: "agent",
            operator: false,
            local: false,
            csrf: "x",
        };
        let theirs = approvals_fragment(
            &json!({"approvals": [{"approval_id": "appr_2", "status": "pending", "requested_by": {"id": "p"}}]}),
            &agent,
        );
        assert!(!theirs.contains("Approve"));
    }
}
