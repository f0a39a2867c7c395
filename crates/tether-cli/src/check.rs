//! `tether check`: a config, a single device manifest or a `.cedar` policy,
//! every defect printed (exit 1 on any); and the defect printer the serving
//! commands share.

use crate::config;
use std::path::Path;
use std::process::ExitCode;

/// Prints every defect, one a line, and how many there were, on stderr.
pub fn print_defects(defects: &[tether_kernel::loader::Defect]) {
    for d in defects {
        eprintln!("{d}");
    }
    eprintln!("tether: {} defect(s); nothing was started", defects.len());
}

/// `tether check FILE`: a config (with its principals and policy) or a
/// single manifest; a `.cedar` file goes to [`check_policy_file`].
pub fn check(file: &Path, print_schema: bool) -> ExitCode {
    if file.extension().is_some_and(|e| e == "cedar") {
        return check_policy_file(file, print_schema);
    }
    let loaded = match config::read(Some(file)) {
        Ok(l) => l,
        Err(defects) => {
            print_defects(&defects);
            return ExitCode::from(1);
        }
    };
    if let Err(defects) = config::authenticator(&loaded, file) {
        print_defects(&defects);
        return ExitCode::from(1);
    }
    let cell = match config::load_cell(&loaded) {
        Ok(cell) => cell,
        Err(defects) => {
            print_defects(&defects);
            return ExitCode::from(1);
        }
    };
    for d in &cell.devices {
        println!(
            "ok: device `{}` ({}, {}, {} binding(s)) from {}",
            d.manifest.device_id,
            d.manifest.mode.as_str(),
            d.manifest.risk_class,
            d.bindings.len(),
            d.origin
        );
    }
    report_policy(&cell, loaded.policy.as_ref(), print_schema)
}

/// Validates a policy against a cell and says so; exit 1 on a defect.
fn report_policy(
    cell: &tether_kernel::loader::Cell,
    policy: Option<&(String, String)>,
    print_schema: bool,
) -> ExitCode {
    if print_schema {
        println!("{}", tether_kernel::policy::schema_for(cell));
    }
    let source = policy.map(|(n, t)| (n.as_str(), t.as_str()));
    match tether_kernel::policy::check_policy(cell, source) {
        Ok(p) => {
            println!(
                "ok: policy {} ({} rule(s): {})",
                p.name(),
                p.policy_ids().len(),
                p.policy_ids().join(", ")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            eprintln!("tether: the policy is invalid; nothing was started");
            ExitCode::from(1)
        }
    }
}

/// `tether check FILE.cedar`: the policy against the built-in cell.
fn check_policy_file(file: &Path, print_schema: bool) -> ExitCode {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: cannot read policy: {e}", file.display());
            return ExitCode::from(1);
        }
    };
    let cell = match config::read(None).and_then(|l| config::load_cell(&l)) {
        Ok(c) => c,
        Err(defects) => {
            print_defects(&defects);
            return ExitCode::from(1);
        }
    };
    println!("checking {} against the built-in cell (use a config's `policy` key to check against yours)", file.display());
    report_policy(
        &cell,
        Some(&(file.display().to_string(), text)),
        print_schema,
    )
}
