//! The architecture test: pins the shape of the workspace so that a
//! restructuring which quietly undoes a boundary fails here, by name, instead
//! of eroding it one import at a time.
//!
//! What it pins, and why:
//!
//! 1. **Dependency edges between Tether crates** (from `cargo metadata`): each
//!    normal or build dependency of one Tether crate on another must be in
//!    [`ALLOWED_NORMAL_DEPS`] / [`ALLOWED_BUILD_DEPS`] below. The layering is
//!    the design: contracts (core) and pure checks (limits, policy) at the
//!    bottom, the store on core, the kernel over them, and the surfaces
//!    (drivers, server) reaching the rest only through the kernel. Dev
//!    dependencies are free, except that nothing may depend on `tether-cli`.
//! 2. **`Authorized::mint` is called only inside `crates/tether-kernel/src`**:
//!    the sealed witness is the proof that the evaluation order ran, and only
//!    the kernel may make one. (The compile-fail fixture that proves the
//!    constructor is private is the one listed exemption.)
//! 3. **`tether-server` names no `tether-store` item**: the surfaces reach
//!    durable state through the kernel, never the store directly.
//! 4. **Size bounds** for non-test code: files of at most 900 lines, functions
//!    of at most 100 lines from signature to closing brace, so each is read
//!    whole.
//! 5. **No `"MHS.…"` string literal outside `crates/tether-core/src`**: error
//!    codes come from the registry (`tether_core::Code`, the `NOT_CERTIFIED`
//!    constants), so a code cannot be misspelt or drift from the catalogue.
//! 6. **Each crate README states its Tether dependencies as cargo does**, on
//!    its `**Depends on:**` and `**Depended on by:**` lines.
//! 7. **The `Kernel` exposes no public `store` accessor** to other crates.
//!
//! Every gate checks itself: a scan that read too few files, a file it could
//! not read, or a file that did not parse fails the test rather than passing
//! quietly over less than it claims. The `*_scanner_*` tests feed the same
//! scanners synthetic source and assert they flag what they must and pass
//! what they must.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use serde_json::Value;
use syn::visit::{self, Visit};
use syn::{Attribute, Item, Meta, Type, Visibility};

// ---------------------------------------------------------------------------
// The allowlists
// ---------------------------------------------------------------------------

/// Where the allowlists live, for failure messages.
const THIS_FILE: &str = "crates/tether-cli/tests/architecture.rs";

/// The workspace crates this test knows; a crate missing from metadata, or a
/// crate metadata has and this list lacks, fails the dependency test.
const EXPECTED_CRATES: &[&str] = &[
    "tether-core",
    "tether-limits",
    "tether-policy",
    "tether-store",
    "tether-kernel",
    "tether-drivers",
    "tether-server",
    "tether-cli",
    "tether-fuzz",
];

/// The normal (`[dependencies]`) edges allowed between Tether crates: the
/// target layering of the current redesign.
const ALLOWED_NORMAL_DEPS: &[(&str, &[&str])] = &[
    ("tether-core", &[]),
    ("tether-limits", &[]),
    ("tether-policy", &[]),
    ("tether-store", &["tether-core"]),
    (
        "tether-kernel",
        &[
            "tether-core",
            "tether-limits",
            "tether-policy",
            "tether-store",
        ],
    ),
    // Drivers convert native units to declared ones at their boundary with
    // the one unit table (tether_limits::units); they never call the engine.
    (
        "tether-drivers",
        &["tether-core", "tether-kernel", "tether-limits"],
    ),
    ("tether-server", &["tether-core", "tether-kernel"]),
    (
        "tether-cli",
        &[
            "tether-core",
            "tether-kernel",
            "tether-drivers",
            "tether-server",
            // Only for the offline tools: open, verify, export.
            "tether-store",
        ],
    ),
    // The fuzz targets (issue 21) drive every layer's public entry points
    // (the canonical writer, the verifier, the limits engine, the policy
    // loader, the manifest loader, the surfaces) and judge what they answer;
    // nothing depends on them.
    (
        "tether-fuzz",
        &[
            "tether-core",
            "tether-limits",
            "tether-policy",
            "tether-store",
            "tether-kernel",
            "tether-drivers",
            "tether-server",
        ],
    ),
];

/// The build (`[build-dependencies]`) edges allowed between Tether crates:
/// none.
const ALLOWED_BUILD_DEPS: &[(&str, &str)] = &[];

/// Compile-fail fixtures (trybuild) that spell a call to `Authorized::mint`
/// on purpose: they prove the call does not compile outside the kernel. Each
/// must exist, have its `.stderr` beside it and still spell the call, or the
/// exemption is stale and the test fails.
const MINT_COMPILE_FAIL_FIXTURES: &[&str] = &["crates/tether-drivers/tests/ui/mint_is_private.rs"];

/// Bounds of check 4.
const MAX_FILE_LINES: usize = 900;
const MAX_FN_LINES: usize = 100;

/// Floors of the self-checks: a scan that saw fewer has degraded (wrong root,
/// a walk that stopped early, a filter too eager). Set well below today's
/// counts: 132 `.rs` files under `crates/`, 79 non-test files under
/// `crates/*/src` holding 1,092 functions, 15 files under
/// `crates/tether-server/src`.
const MIN_FILES_ALL: usize = 100;
const MIN_FILES_SRC: usize = 60;
const MIN_FILES_SERVER_SRC: usize = 10;
const MIN_FNS_SRC: usize = 500;

// ---------------------------------------------------------------------------
// Workspace and cargo metadata
// ---------------------------------------------------------------------------

fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root
        .canonicalize()
        .unwrap_or_else(|e| panic!("cannot resolve the workspace root {}: {e}", root.display()));
    assert!(
        root.join("Cargo.toml").is_file() && root.join("crates").is_dir(),
        "{} is not the workspace root (no Cargo.toml or crates/)",
        root.display()
    );
    root
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum DepKind {
    Normal,
    Build,
    Dev,
}

impl DepKind {
    fn describe(self) -> &'static str {
        match self {
            DepKind::Normal => "normal dependency ([dependencies])",
            DepKind::Build => "build dependency ([build-dependencies])",
            DepKind::Dev => "dev-dependency ([dev-dependencies])",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    from: String,
    to: String,
    kind: DepKind,
}

#[derive(Debug)]
struct Metadata {
    /// Workspace crate name → its directory relative to the root.
    crates: BTreeMap<String, String>,
    /// Every dependency of a workspace crate on a Tether crate.
    edges: Vec<Edge>,
}

impl Metadata {
    fn normal_deps_of(&self, name: &str) -> BTreeSet<String> {
        self.edges
            .iter()
            .filter(|e| e.kind == DepKind::Normal && e.from == name)
            .map(|e| e.to.clone())
            .collect()
    }
    fn normal_dependents_of(&self, name: &str) -> BTreeSet<String> {
        self.edges
            .iter()
            .filter(|e| e.kind == DepKind::Normal && e.to == name)
            .map(|e| e.from.clone())
            .collect()
    }
}

/// `cargo metadata --no-deps`, read once; fails unless all the expected
/// crates were read.
fn metadata() -> &'static Metadata {
    static METADATA: OnceLock<Metadata> = OnceLock::new();
    METADATA.get_or_init(|| {
        let root = workspace_root();
        let out = Command::new(env!("CARGO"))
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--manifest-path",
            ])
            .arg(root.join("Cargo.toml"))
            .output()
            .unwrap_or_else(|e| panic!("cannot run `cargo metadata`: {e}"));
        assert!(
            out.status.success(),
            "`cargo metadata` failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let json: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("`cargo metadata` printed no JSON: {e}"));
        let meta = parse_metadata(&json, &root).unwrap_or_else(|e| panic!("{e}"));
        let missing: Vec<&str> = EXPECTED_CRATES
            .iter()
            .copied()
            .filter(|c| !meta.crates.contains_key(*c))
            .collect();
        assert!(
            meta.crates.len() >= EXPECTED_CRATES.len() && missing.is_empty(),
            "cargo metadata gave {} workspace crates ({:?}), expected at least the {} of \
             EXPECTED_CRATES in {THIS_FILE}; missing: {missing:?}",
            meta.crates.len(),
            meta.crates.keys().collect::<Vec<_>>(),
            EXPECTED_CRATES.len(),
        );
        meta
    })
}

fn parse_metadata(json: &Value, root: &Path) -> Result<Metadata, String> {
    let packages = json["packages"]
        .as_array()
        .ok_or("cargo metadata: no `packages` array")?;
    let mut crates = BTreeMap::new();
    for p in packages {
        let name = p["name"]
            .as_str()
            .ok_or("cargo metadata: a package without a name")?;
        let manifest = p["manifest_path"]
            .as_str()
            .ok_or_else(|| format!("cargo metadata: {name} has no manifest_path"))?;
        let dir = Path::new(manifest)
            .parent()
            .ok_or_else(|| format!("cargo metadata: {name}: odd manifest_path {manifest}"))?;
        let rel = dir.strip_prefix(root).unwrap_or(dir);
        crates.insert(name.to_owned(), rel.to_string_lossy().replace('\\', "/"));
    }
    let mut edges = Vec::new();
    for p in packages {
        let from = p["name"].as_str().unwrap_or_default();
        let deps = p["dependencies"]
            .as_array()
            .ok_or_else(|| format!("cargo metadata: {from} has no `dependencies` array"))?;
        for d in deps {
            let to = d["name"]
                .as_str()
                .ok_or_else(|| format!("cargo metadata: a dependency of {from} has no name"))?;
            if !(crates.contains_key(to) || to.starts_with("tether-")) {
                continue;
            }
            let kind = match &d["kind"] {
                Value::Null => DepKind::Normal,
                Value::String(k) if k == "build" => DepKind::Build,
                Value::String(k) if k == "dev" => DepKind::Dev,
                other => {
                    return Err(format!(
                        "cargo metadata: dependency {from} → {to} has an unknown kind {other}"
                    ))
                }
            };
            edges.push(Edge {
                from: from.to_owned(),
                to: to.to_owned(),
                kind,
            });
        }
    }
    edges.sort();
    edges.dedup();
    Ok(Metadata { crates, edges })
}

/// The edges the allowlists do not allow (dev-dependencies are not judged
/// here), each as a sentence.
fn disallowed_edges(edges: &[Edge], crates: &BTreeMap<String, String>) -> Vec<String> {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED_NORMAL_DEPS.iter().copied().collect();
    let mut out = Vec::new();
    for name in crates.keys() {
        if !allowed.contains_key(name.as_str()) {
            out.push(format!(
                "{name} is a workspace crate with no entry in ALLOWED_NORMAL_DEPS ({THIS_FILE}); \
                 add one with the edges it is meant to have"
            ));
        }
    }
    for e in edges {
        let manifest = crates.get(&e.from).map_or_else(
            || "its Cargo.toml".to_owned(),
            |d| format!("{d}/Cargo.toml"),
        );
        let ok = match e.kind {
            DepKind::Normal => allowed
                .get(e.from.as_str())
                .is_some_and(|tos| tos.contains(&e.to.as_str())),
            DepKind::Build => ALLOWED_BUILD_DEPS.contains(&(e.from.as_str(), e.to.as_str())),
            DepKind::Dev => true,
        };
        if !ok {
            let list = if e.kind == DepKind::Build {
                "ALLOWED_BUILD_DEPS"
            } else {
                "ALLOWED_NORMAL_DEPS"
            };
            out.push(format!(
                "{} → {}: a {} declared in {manifest}, not in {list} ({THIS_FILE})",
                e.from,
                e.to,
                e.kind.describe()
            ));
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Source files
// ---------------------------------------------------------------------------

/// Every `.rs` file under `dir` (recursively, skipping `target` and hidden
/// directories), sorted; an unreadable directory is an error.
fn rust_files(dir: &Path, errors: &mut Vec<(String, String)>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) => {
                errors.push((String::new(), format!("cannot list {}: {e}", d.display())));
                continue;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    errors.push((String::new(), format!("cannot list {}: {e}", d.display())));
                    continue;
                }
            };
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(ft) = entry.file_type() else {
                errors.push((String::new(), format!("cannot stat {}", path.display())));
                continue;
            };
            if ft.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn rel_path(root: &Path, p: &Path) -> String {
    p.strip_prefix(root)
        .unwrap_or(p)
        .to_string_lossy()
        .replace('\\', "/")
}

/// Parses source text; the error names the file, line and column.
fn parse(rel: &str, text: &str) -> Result<syn::File, String> {
    syn::parse_file(text).map_err(|e| {
        let at = e.span().start();
        format!("{rel}:{}:{}: does not parse: {e}", at.line, at.column + 1)
    })
}

/// What each scanner found in one file. Line numbers only (spans cannot
/// leave the thread that parsed them).
#[derive(Debug, Default)]
struct FileReport {
    rel: String,
    /// Under `crates/<crate>/src/`.
    is_src: bool,
    /// A module only compiled for tests (declared `#[cfg(test)] mod x;`).
    test_only: bool,
    mint: MintScan,
    store_paths: Vec<Hit>,
    sizes: Sizes,
    mhs: Vec<Hit>,
    kernel: KernelScan,
}

#[derive(Debug)]
struct WorkspaceScan {
    files: Vec<FileReport>,
    /// (file, message) for each file that could not be read or parsed, and
    /// (`""`, message) for each directory that could not be listed.
    errors: Vec<(String, String)>,
}

impl WorkspaceScan {
    /// The errors that concern files whose path `scope` accepts, and every
    /// listing error (a directory not listed may have held such files).
    fn errors_in(&self, scope: impl Fn(&str) -> bool) -> Vec<&str> {
        self.errors
            .iter()
            .filter(|(rel, _)| rel.is_empty() || scope(rel))
            .map(|(_, e)| e.as_str())
            .collect()
    }
    fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a FileReport> + 'a {
        self.files.iter().filter(move |f| f.rel.starts_with(prefix))
    }
    /// Non-test source files: under `crates/*/src`, not a `#[cfg(test)]` module.
    fn non_test_src(&self) -> impl Iterator<Item = &FileReport> + '_ {
        self.files.iter().filter(|f| f.is_src && !f.test_only)
    }
}

fn is_src_path(rel: &str) -> bool {
    rel.split('/').nth(2) == Some("src")
}

/// Fails with every error in scope: a scan that skipped a file passes
/// nothing.
fn assert_no_scan_errors(scan: &WorkspaceScan, what: &str, scope: impl Fn(&str) -> bool) {
    let errors = scan.errors_in(scope);
    assert!(
        errors.is_empty(),
        "the {what} scan is incomplete, so it proves nothing; fix these first:\n  {}",
        errors.join("\n  ")
    );
}

/// Reads and parses every `.rs` file under `crates/` once, running each
/// scanner on it.
fn workspace_scan() -> &'static WorkspaceScan {
    static SCAN: OnceLock<WorkspaceScan> = OnceLock::new();
    SCAN.get_or_init(|| {
        let root = workspace_root();
        let mut errors = Vec::new();
        let paths = rust_files(&root.join("crates"), &mut errors);
        let mut files = Vec::new();
        // Out-of-line `#[cfg(test)] mod x;` declarations: (declaring file, decl).
        let mut test_mods: Vec<(PathBuf, TestModDecl)> = Vec::new();
        for path in &paths {
            let rel = rel_path(&root, path);
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => {
                    errors.push((rel.clone(), format!("{rel}: cannot be read: {e}")));
                    continue;
                }
            };
            let file = match parse(&rel, &text) {
                Ok(f) => f,
                Err(e) => {
                    errors.push((rel.clone(), e));
                    continue;
                }
            };
            let is_src = is_src_path(&rel);
            let mut report = FileReport {
                rel: rel.clone(),
                is_src,
                mint: scan_mint(&file, &text),
                ..FileReport::default()
            };
            if is_src {
                report.store_paths = scan_crate_paths(&file, &text, "tether_store");
                report.sizes = scan_sizes(&file, &text);
                report.mhs = scan_mhs_literals(&file);
                report.kernel = scan_kernel_store(&file, &text);
                for m in &report.sizes.test_mods {
                    test_mods.push((path.clone(), m.clone()));
                }
            }
            files.push(report);
        }
        // Mark the files of out-of-line test modules (and everything below).
        let mut test_roots: Vec<PathBuf> = Vec::new();
        for (decl_file, m) in &test_mods {
            let candidates = module_file_candidates(decl_file, m);
            let found: Vec<&PathBuf> = candidates.iter().filter(|c| c.is_file()).collect();
            if found.is_empty() {
                let rel = rel_path(&root, decl_file);
                let msg = format!(
                    "{rel}:{}: `#[cfg(test)] mod {};` has no file among {:?}",
                    m.line,
                    m.name,
                    candidates
                        .iter()
                        .map(|c| rel_path(&root, c))
                        .collect::<Vec<_>>()
                );
                errors.push((rel, msg));
            }
            for f in found {
                test_roots.push(f.clone());
                if let Some(dir) = module_dir(f) {
                    test_roots.push(dir);
                }
            }
        }
        for f in &mut files {
            let abs = root.join(&f.rel);
            f.test_only = test_roots.iter().any(|t| abs == *t || abs.starts_with(t));
        }
        WorkspaceScan { files, errors }
    })
}

/// Where the file of an out-of-line module may be.
fn module_file_candidates(decl_file: &Path, m: &TestModDecl) -> Vec<PathBuf> {
    let parent = decl_file.parent().unwrap_or(Path::new("."));
    let stem = decl_file.file_stem().unwrap_or_default().to_string_lossy();
    let mod_rs = matches!(stem.as_ref(), "lib" | "main" | "mod");
    let own_dir = if mod_rs {
        parent.to_path_buf()
    } else {
        parent.join(stem.as_ref())
    };
    if let Some(p) = &m.path_attr {
        return vec![parent.join(p), own_dir.join(p)];
    }
    vec![
        own_dir.join(format!("{}.rs", m.name)),
        own_dir.join(&m.name).join("mod.rs"),
    ]
}

/// The directory holding the submodules of a module file.
fn module_dir(file: &Path) -> Option<PathBuf> {
    let parent = file.parent()?;
    let stem = file.file_stem()?.to_string_lossy();
    if stem == "mod" {
        Some(parent.to_path_buf())
    } else {
        Some(parent.join(stem.as_ref()))
    }
}

// ---------------------------------------------------------------------------
// Shared syntax helpers
// ---------------------------------------------------------------------------

/// One finding: a line and what was seen there.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Hit {
    line: usize,
    what: String,
}

/// `#[cfg(test)]`, or a `cfg` that requires `test` (`all(test, …)`).
fn is_cfg_test(attrs: &[Attribute]) -> bool {
    fn requires_test(meta: &Meta) -> bool {
        match meta {
            Meta::Path(p) => p.is_ident("test"),
            Meta::List(list) => {
                let Ok(args) = list.parse_args_with(
                    syn::punctuated::Punctuated::<Meta, syn::Token![,]>::parse_terminated,
                ) else {
                    return false;
                };
                if list.path.is_ident("all") {
                    args.iter().any(requires_test)
                } else if list.path.is_ident("any") {
                    !args.is_empty() && args.iter().all(requires_test)
                } else {
                    false
                }
            }
            Meta::NameValue(_) => false,
        }
    }
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<Meta>().is_ok_and(|m| requires_test(&m))
    })
}

/// `#[test]`, `#[tokio::test]` and the like.
fn is_test_fn(attrs: &[Attribute]) -> bool {
    attrs
        .iter()
        .any(|a| a.path().segments.last().is_some_and(|s| s.ident == "test"))
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn impl_item_attrs(item: &syn::ImplItem) -> &[Attribute] {
    match item {
        syn::ImplItem::Const(i) => &i.attrs,
        syn::ImplItem::Fn(i) => &i.attrs,
        syn::ImplItem::Type(i) => &i.attrs,
        syn::ImplItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

fn trait_item_attrs(item: &syn::TraitItem) -> &[Attribute] {
    match item {
        syn::TraitItem::Const(i) => &i.attrs,
        syn::TraitItem::Fn(i) => &i.attrs,
        syn::TraitItem::Type(i) => &i.attrs,
        syn::TraitItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

/// The last identifier of a type path (`a::b::Kernel<T>` → `Kernel`).
fn type_name(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        Type::Group(g) => type_name(&g.elem),
        Type::Paren(p) => type_name(&p.elem),
        _ => None,
    }
}

/// Every leaf token of a stream, groups opened (their contents in order).
fn leaf_tokens(ts: TokenStream, out: &mut Vec<TokenTree>) {
    for tt in ts {
        match tt {
            TokenTree::Group(g) => leaf_tokens(g.stream(), out),
            leaf => out.push(leaf),
        }
    }
}

/// First and last line of a syntax node, from its tokens (attributes and doc
/// comments included).
fn line_range(node: &impl ToTokens) -> (usize, usize) {
    fn walk(ts: TokenStream, lo: &mut usize, hi: &mut usize) {
        for tt in ts {
            if let TokenTree::Group(g) = &tt {
                *lo = (*lo).min(g.span_open().start().line);
                *hi = (*hi).max(g.span_close().end().line);
                walk(g.stream(), lo, hi);
            } else {
                let s = tt.span();
                *lo = (*lo).min(s.start().line);
                *hi = (*hi).max(s.end().line);
            }
        }
    }
    let (mut lo, mut hi) = (usize::MAX, 0);
    walk(node.to_token_stream(), &mut lo, &mut hi);
    (lo, hi)
}

/// Source lines that are code as far as a line-based check is concerned
/// (1-based line number, text): not `//` comment lines.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
}

/// Line ranges of test-only code: `#[cfg(test)]` items and `#[test]` fns, at
/// any depth.
fn test_ranges(file: &syn::File) -> Vec<(usize, usize)> {
    #[derive(Default)]
    struct V(Vec<(usize, usize)>);
    impl<'ast> Visit<'ast> for V {
        fn visit_item(&mut self, i: &'ast Item) {
            let attrs = item_attrs(i);
            if is_cfg_test(attrs) || (matches!(i, Item::Fn(_)) && is_test_fn(attrs)) {
                self.0.push(line_range(i));
                return;
            }
            visit::visit_item(self, i);
        }
        fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
            let attrs = impl_item_attrs(i);
            if is_cfg_test(attrs) || is_test_fn(attrs) {
                self.0.push(line_range(i));
                return;
            }
            visit::visit_impl_item(self, i);
        }
        fn visit_trait_item(&mut self, i: &'ast syn::TraitItem) {
            if is_cfg_test(trait_item_attrs(i)) {
                self.0.push(line_range(i));
                return;
            }
            visit::visit_trait_item(self, i);
        }
    }
    let mut v = V::default();
    v.visit_file(file);
    v.0
}

fn in_ranges(ranges: &[(usize, usize)], line: usize) -> bool {
    ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&line))
}

/// Findings keyed by line, several layers per line merged into one `Hit`.
#[derive(Default)]
struct Hits(BTreeMap<usize, BTreeSet<String>>);

impl Hits {
    fn add(&mut self, line: usize, what: impl Into<String>) {
        self.0.entry(line).or_default().insert(what.into());
    }
    fn into_vec(self) -> Vec<Hit> {
        self.0
            .into_iter()
            .map(|(line, whats)| Hit {
                line,
                what: whats.into_iter().collect::<Vec<_>>().join("; "),
            })
            .collect()
    }
}

fn path_text(path: &syn::Path) -> String {
    let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    format!(
        "{}{}",
        if path.leading_colon.is_some() {
            "::"
        } else {
            ""
        },
        segs.join("::")
    )
}

// ---------------------------------------------------------------------------
// Check 2: Authorized::mint
// ---------------------------------------------------------------------------

/// The textual fallback's needles, spelt so that this file does not contain
/// them.
const MINT_CALL: &str = concat!("Authorized", "::mint(");
const MINT_QSELF_CALL: &str = concat!("Authorized>", "::mint(");

#[derive(Debug, Default)]
struct MintScan {
    /// Lines of `fn mint` inside an inherent `impl Authorized`.
    definitions: Vec<usize>,
    /// Paths naming `Authorized::mint` in the syntax tree (calls and
    /// references: `Authorized::mint(…)`, `a::Authorized::mint`,
    /// `<Authorized>::mint`, `Self::mint` inside `impl Authorized`, a renamed
    /// import).
    syn_calls: Vec<Hit>,
    /// `Authorized :: mint` or `Authorized > :: mint` in the token stream
    /// (sees inside macro invocations, which the syntax tree does not).
    token_calls: Vec<Hit>,
    /// Non-comment lines containing `Authorized::mint(` once whitespace is
    /// removed.
    text_calls: Vec<Hit>,
}

impl MintScan {
    fn all_calls(&self) -> Vec<Hit> {
        let mut hits = Hits::default();
        for h in self
            .syn_calls
            .iter()
            .chain(&self.token_calls)
            .chain(&self.text_calls)
        {
            hits.add(h.line, h.what.clone());
        }
        hits.into_vec()
    }
}

fn scan_mint(file: &syn::File, text: &str) -> MintScan {
    // Names `Authorized` goes by in this file: itself, `use … as X`, `type X = Authorized`.
    struct Aliases(BTreeSet<String>);
    impl<'ast> Visit<'ast> for Aliases {
        fn visit_use_rename(&mut self, r: &'ast syn::UseRename) {
            if self.0.contains(&r.ident.to_string()) {
                self.0.insert(r.rename.to_string());
            }
        }
        fn visit_item_type(&mut self, t: &'ast syn::ItemType) {
            if type_name(&t.ty).is_some_and(|n| self.0.contains(&n)) {
                self.0.insert(t.ident.to_string());
            }
            visit::visit_item_type(self, t);
        }
    }
    struct V<'a> {
        aliases: &'a BTreeSet<String>,
        /// For each enclosing impl: is its self type `Authorized`?
        impls: Vec<bool>,
        out: MintScan,
    }
    impl V<'_> {
        fn is_authorized(&self, ty: &Type) -> bool {
            type_name(ty).is_some_and(|n| self.aliases.contains(&n))
        }
        fn check(&mut self, qself: Option<&syn::QSelf>, path: &syn::Path) {
            let Some(last) = path.segments.last() else {
                return;
            };
            if last.ident != "mint" {
                return;
            }
            let line = last.ident.span().start().line;
            let n = path.segments.len();
            if let Some(q) = qself {
                if self.is_authorized(&q.ty) {
                    self.out.syn_calls.push(Hit {
                        line,
                        what: format!("<Authorized…>::{}", path_text(path)),
                    });
                }
                return;
            }
            if n < 2 {
                return;
            }
            let prev = path.segments[n - 2].ident.to_string();
            if self.aliases.contains(&prev) {
                self.out.syn_calls.push(Hit {
                    line,
                    what: format!("path {}", path_text(path)),
                });
            } else if prev == "Self" && n == 2 && self.impls.last() == Some(&true) {
                self.out.syn_calls.push(Hit {
                    line,
                    what: "Self::mint inside impl Authorized".to_owned(),
                });
            }
        }
    }
    impl<'ast> Visit<'ast> for V<'_> {
        fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
            let is_auth = self.is_authorized(&i.self_ty);
            if is_auth && i.trait_.is_none() {
                for it in &i.items {
                    if let syn::ImplItem::Fn(f) = it {
                        if f.sig.ident == "mint" {
                            self.out.definitions.push(f.sig.ident.span().start().line);
                        }
                    }
                }
            }
            self.impls.push(is_auth);
            visit::visit_item_impl(self, i);
            self.impls.pop();
        }
        fn visit_expr_path(&mut self, e: &'ast syn::ExprPath) {
            self.check(e.qself.as_ref(), &e.path);
            visit::visit_expr_path(self, e);
        }
    }

    let mut aliases = Aliases(BTreeSet::from(["Authorized".to_owned()]));
    aliases.visit_file(file);
    let aliases = aliases.0;
    let mut v = V {
        aliases: &aliases,
        impls: Vec::new(),
        out: MintScan::default(),
    };
    v.visit_file(file);
    let mut out = v.out;

    let mut toks = Vec::new();
    leaf_tokens(file.to_token_stream(), &mut toks);
    let ident = |t: &TokenTree, f: &dyn Fn(&str) -> bool| matches!(t, TokenTree::Ident(i) if f(&i.to_string()));
    let punct = |t: &TokenTree, c: char| matches!(t, TokenTree::Punct(p) if p.as_char() == c);
    for (i, t) in toks.iter().enumerate() {
        if !ident(t, &|s| aliases.contains(s)) {
            continue;
        }
        let rest = &toks[i + 1..];
        let plain = rest.len() >= 3
            && punct(&rest[0], ':')
            && punct(&rest[1], ':')
            && ident(&rest[2], &|s| s == "mint");
        let qself = rest.len() >= 4
            && punct(&rest[0], '>')
            && punct(&rest[1], ':')
            && punct(&rest[2], ':')
            && ident(&rest[3], &|s| s == "mint");
        if plain || qself {
            out.token_calls.push(Hit {
                line: t.span().start().line,
                what: format!("tokens {t}{}::mint", if qself { ">" } else { "" }),
            });
        }
    }

    for (line, l) in code_lines(text) {
        let squeezed: String = l.chars().filter(|c| !c.is_whitespace()).collect();
        if squeezed.contains(MINT_CALL) || squeezed.contains(MINT_QSELF_CALL) {
            out.text_calls.push(Hit {
                line,
                what: "text".to_owned(),
            });
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Check 3: paths into another crate
// ---------------------------------------------------------------------------

/// Every place the source names crate `krate` (as written in paths:
/// `tether_store`): paths and `use` trees that start with it, `extern
/// crate`, the identifier anywhere in the tokens (macro bodies included), and
/// the identifier as a word on a non-comment line. Hits in test-only code are
/// marked so.
fn scan_crate_paths(file: &syn::File, text: &str, krate: &str) -> Vec<Hit> {
    struct V<'a> {
        krate: &'a str,
        hits: Hits,
    }
    impl V<'_> {
        fn use_root(&mut self, tree: &syn::UseTree) {
            match tree {
                syn::UseTree::Path(p) if p.ident == self.krate => {
                    self.hits.add(p.ident.span().start().line, "use tree");
                }
                syn::UseTree::Name(n) if n.ident == self.krate => {
                    self.hits.add(n.ident.span().start().line, "use tree");
                }
                syn::UseTree::Rename(r) if r.ident == self.krate => {
                    self.hits.add(r.ident.span().start().line, "use tree");
                }
                syn::UseTree::Group(g) => {
                    for t in &g.items {
                        self.use_root(t);
                    }
                }
                _ => {}
            }
        }
    }
    impl<'ast> Visit<'ast> for V<'_> {
        fn visit_path(&mut self, p: &'ast syn::Path) {
            if let Some(first) = p.segments.first() {
                if first.ident == self.krate {
                    self.hits.add(
                        first.ident.span().start().line,
                        format!("path {}", path_text(p)),
                    );
                }
            }
            visit::visit_path(self, p);
        }
        fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
            self.use_root(&u.tree);
        }
        fn visit_item_extern_crate(&mut self, e: &'ast syn::ItemExternCrate) {
            if e.ident == self.krate {
                self.hits.add(e.ident.span().start().line, "extern crate");
            }
        }
    }
    let mut v = V {
        krate,
        hits: Hits::default(),
    };
    v.visit_file(file);
    let mut hits = v.hits;

    let mut toks = Vec::new();
    leaf_tokens(file.to_token_stream(), &mut toks);
    for t in &toks {
        if let TokenTree::Ident(i) = t {
            if i == krate {
                hits.add(i.span().start().line, "identifier in tokens");
            }
        }
    }
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    for (line, l) in code_lines(text) {
        let mut from = 0;
        while let Some(at) = l[from..].find(krate) {
            let start = from + at;
            let end = start + krate.len();
            let before = l[..start].chars().next_back();
            let after = l[end..].chars().next();
            if !before.is_some_and(is_word) && !after.is_some_and(is_word) {
                hits.add(line, "text");
                break;
            }
            from = end;
        }
    }
    let tests = test_ranges(file);
    let mut out = hits.into_vec();
    for h in &mut out {
        if in_ranges(&tests, h.line) {
            h.what.push_str(" (test code)");
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Check 4: sizes
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct FnLen {
    line: usize,
    name: String,
    lines: usize,
}

/// An out-of-line `#[cfg(test)] mod name;`.
#[derive(Clone, Debug)]
struct TestModDecl {
    name: String,
    path_attr: Option<String>,
    line: usize,
}

#[derive(Debug, Default)]
struct Sizes {
    total_lines: usize,
    /// Lines of `#[cfg(test)]` items (attributes and docs included).
    test_lines: usize,
    /// Every non-test fn with a body: its signature's first line, name, and
    /// length from that line to the closing brace inclusive.
    fns: Vec<FnLen>,
    test_mods: Vec<TestModDecl>,
}

impl Sizes {
    fn counted_lines(&self) -> usize {
        self.total_lines - self.test_lines
    }
}

fn scan_sizes(file: &syn::File, text: &str) -> Sizes {
    enum Ctx {
        Impl(String),
        Trait(String),
        Fn(String),
    }
    struct V {
        excluded: BTreeSet<usize>,
        fns: Vec<FnLen>,
        test_mods: Vec<TestModDecl>,
        ctx: Vec<Ctx>,
    }
    impl V {
        fn exclude(&mut self, node: &impl ToTokens) {
            let (lo, hi) = line_range(node);
            self.excluded.extend(lo..=hi);
        }
        fn record(
            &mut self,
            name: String,
            vis: &Visibility,
            sig: &syn::Signature,
            block: &syn::Block,
        ) {
            let mut start = line_range(sig).0;
            if !matches!(vis, Visibility::Inherited) {
                start = start.min(line_range(vis).0);
            }
            let end = block.brace_token.span.close().end().line;
            self.fns.push(FnLen {
                line: start,
                name,
                lines: end + 1 - start,
            });
        }
        fn in_fn(&mut self, name: String, block: &syn::Block) {
            self.ctx.push(Ctx::Fn(name));
            self.visit_block(block);
            self.ctx.pop();
        }
    }
    impl<'ast> Visit<'ast> for V {
        fn visit_item(&mut self, i: &'ast Item) {
            if is_cfg_test(item_attrs(i)) {
                self.exclude(i);
                if let Item::Mod(m) = i {
                    if m.content.is_none() {
                        let path_attr = m.attrs.iter().find_map(|a| match &a.meta {
                            Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                                syn::Expr::Lit(syn::ExprLit {
                                    lit: syn::Lit::Str(s),
                                    ..
                                }) => Some(s.value()),
                                _ => None,
                            },
                            _ => None,
                        });
                        self.test_mods.push(TestModDecl {
                            name: m.ident.to_string(),
                            path_attr,
                            line: m.ident.span().start().line,
                        });
                    }
                }
                return;
            }
            visit::visit_item(self, i);
        }
        fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
            if is_cfg_test(impl_item_attrs(i)) {
                self.exclude(i);
                return;
            }
            visit::visit_impl_item(self, i);
        }
        fn visit_trait_item(&mut self, i: &'ast syn::TraitItem) {
            if is_cfg_test(trait_item_attrs(i)) {
                self.exclude(i);
                return;
            }
            visit::visit_trait_item(self, i);
        }
        fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
            let name = type_name(&i.self_ty).unwrap_or_else(|| "_".to_owned());
            self.ctx.push(Ctx::Impl(name));
            visit::visit_item_impl(self, i);
            self.ctx.pop();
        }
        fn visit_item_trait(&mut self, i: &'ast syn::ItemTrait) {
            self.ctx.push(Ctx::Trait(i.ident.to_string()));
            visit::visit_item_trait(self, i);
            self.ctx.pop();
        }
        fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
            if is_test_fn(&f.attrs) {
                return;
            }
            let name = match self.ctx.last() {
                Some(Ctx::Fn(outer)) => format!("{} (nested in {outer})", f.sig.ident),
                _ => f.sig.ident.to_string(),
            };
            self.record(name.clone(), &f.vis, &f.sig, &f.block);
            self.in_fn(name, &f.block);
        }
        fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
            if is_test_fn(&f.attrs) {
                return;
            }
            let name = match self.ctx.last() {
                Some(Ctx::Impl(t)) => format!("{t}::{}", f.sig.ident),
                _ => f.sig.ident.to_string(),
            };
            self.record(name.clone(), &f.vis, &f.sig, &f.block);
            self.in_fn(name, &f.block);
        }
        fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
            let Some(block) = &f.default else {
                return;
            };
            if is_test_fn(&f.attrs) {
                return;
            }
            let name = match self.ctx.last() {
                Some(Ctx::Trait(t)) => format!("{t}::{}", f.sig.ident),
                _ => f.sig.ident.to_string(),
            };
            self.record(name.clone(), &Visibility::Inherited, &f.sig, block);
            self.in_fn(name, block);
        }
    }
    let mut v = V {
        excluded: BTreeSet::new(),
        fns: Vec::new(),
        test_mods: Vec::new(),
        ctx: Vec::new(),
    };
    v.visit_file(file);
    let total_lines = text.lines().count();
    let test_lines = v.excluded.range(1..=total_lines).count();
    v.fns.sort();
    Sizes {
        total_lines,
        test_lines,
        fns: v.fns,
        test_mods: v.test_mods,
    }
}

// ---------------------------------------------------------------------------
// Check 5: MHS code literals
// ---------------------------------------------------------------------------

/// String literals (plain or raw) whose value starts with `MHS.`, in non-test
/// code: the syntax tree's literals, plus literals inside macro invocations
/// (`json!`, `format!`) and attribute arguments (`#[error("…")]`), which the
/// tree keeps as tokens. Doc comments and comments are not literals.
fn scan_mhs_literals(file: &syn::File) -> Vec<Hit> {
    struct V(Hits);
    impl V {
        fn lit(&mut self, s: &syn::LitStr) {
            let value = s.value();
            if value.starts_with("MHS.") {
                self.0.add(s.span().start().line, format!("{value:?}"));
            }
        }
        fn tokens(&mut self, ts: TokenStream) {
            let mut toks = Vec::new();
            leaf_tokens(ts, &mut toks);
            for t in toks {
                if let TokenTree::Literal(l) = t {
                    if let syn::Lit::Str(s) = syn::Lit::new(l) {
                        self.lit(&s);
                    }
                }
            }
        }
    }
    impl<'ast> Visit<'ast> for V {
        fn visit_item(&mut self, i: &'ast Item) {
            let attrs = item_attrs(i);
            if is_cfg_test(attrs) || (matches!(i, Item::Fn(_)) && is_test_fn(attrs)) {
                return;
            }
            visit::visit_item(self, i);
        }
        fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
            let attrs = impl_item_attrs(i);
            if is_cfg_test(attrs) || is_test_fn(attrs) {
                return;
            }
            visit::visit_impl_item(self, i);
        }
        fn visit_trait_item(&mut self, i: &'ast syn::TraitItem) {
            if is_cfg_test(trait_item_attrs(i)) {
                return;
            }
            visit::visit_trait_item(self, i);
        }
        fn visit_attribute(&mut self, a: &'ast Attribute) {
            if a.path().is_ident("doc") {
                return;
            }
            if let Meta::List(l) = &a.meta {
                self.tokens(l.tokens.clone());
            }
            visit::visit_attribute(self, a);
        }
        fn visit_macro(&mut self, m: &'ast syn::Macro) {
            self.tokens(m.tokens.clone());
            visit::visit_macro(self, m);
        }
        fn visit_lit_str(&mut self, s: &'ast syn::LitStr) {
            self.lit(s);
        }
    }
    let mut v = V(Hits::default());
    v.visit_file(file);
    v.0.into_vec()
}

// ---------------------------------------------------------------------------
// Check 7: the kernel's store accessor
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
struct KernelScan {
    /// Lines of `struct Kernel`.
    kernel_struct: Vec<usize>,
    /// How many `impl Kernel` blocks (inherent or not).
    impl_kernel: usize,
    /// `pub fn store` (unrestricted `pub`) in an inherent `impl Kernel`, and
    /// non-comment lines reading `pub fn store(`.
    pub_store: Vec<Hit>,
}

fn scan_kernel_store(file: &syn::File, text: &str) -> KernelScan {
    struct V {
        out: KernelScan,
        hits: Hits,
    }
    impl<'ast> Visit<'ast> for V {
        fn visit_item_struct(&mut self, s: &'ast syn::ItemStruct) {
            if s.ident == "Kernel" {
                self.out.kernel_struct.push(s.ident.span().start().line);
            }
            visit::visit_item_struct(self, s);
        }
        fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
            if type_name(&i.self_ty).as_deref() == Some("Kernel") {
                self.out.impl_kernel += 1;
                if i.trait_.is_none() {
                    for it in &i.items {
                        if let syn::ImplItem::Fn(f) = it {
                            if f.sig.ident == "store" && matches!(f.vis, Visibility::Public(_)) {
                                self.hits.add(
                                    f.sig.ident.span().start().line,
                                    "`pub fn store` in impl Kernel",
                                );
                            }
                        }
                    }
                }
            }
            visit::visit_item_impl(self, i);
        }
    }
    let mut v = V {
        out: KernelScan::default(),
        hits: Hits::default(),
    };
    v.visit_file(file);
    for (line, l) in code_lines(text) {
        let squeezed: String = l.chars().filter(|c| !c.is_whitespace()).collect();
        if squeezed.contains("pubfnstore(") {
            v.hits.add(line, "text `pub fn store(`");
        }
    }
    let mut out = v.out;
    out.pub_store = v.hits.into_vec();
    out
}

// ---------------------------------------------------------------------------
// Check 6: READMEs
// ---------------------------------------------------------------------------

/// The set a README states on the line starting with `marker`: the
/// `tether-[a-z]+` tokens before the first `;`, or the empty set if it says
/// `nothing` and names none. `Err` says what is wrong with the line.
fn readme_set(readme: &str, marker: &str) -> Result<BTreeSet<String>, String> {
    let line = readme
        .lines()
        .find(|l| l.trim_start().starts_with(marker))
        .ok_or_else(|| format!("no line begins with `{marker}`"))?;
    let rest = &line.trim_start()[marker.len()..];
    let clause = rest.split(';').next().unwrap_or_default();
    let mut set = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = clause[from..].find("tether-") {
        let start = from + at;
        let tail = &clause[start + "tether-".len()..];
        let n = tail.bytes().take_while(u8::is_ascii_lowercase).count();
        if n > 0 {
            set.insert(format!("tether-{}", &tail[..n]));
        }
        from = start + "tether-".len() + n;
    }
    if set.is_empty() {
        let says_nothing = clause
            .split(|c: char| !c.is_alphanumeric())
            .any(|w| w == "nothing");
        if !says_nothing {
            return Err(format!(
                "`{marker}` names no tether crate and does not say `nothing`: {line:?}"
            ));
        }
    }
    Ok(set)
}

fn fmt_set(s: &BTreeSet<String>) -> String {
    if s.is_empty() {
        "nothing".to_owned()
    } else {
        s.iter().cloned().collect::<Vec<_>>().join(", ")
    }
}

// ===========================================================================
// The gates
// ===========================================================================

// --- 1. dependency edges ---------------------------------------------------

#[test]
fn every_tether_crate_dependency_edge_is_in_the_allowlist() {
    let meta = metadata();
    // The allowlist itself names only crates that exist (a typo would allow nothing).
    for (from, tos) in ALLOWED_NORMAL_DEPS {
        for c in std::iter::once(from).chain(tos.iter()) {
            assert!(
                meta.crates.contains_key(*c),
                "ALLOWED_NORMAL_DEPS in {THIS_FILE} names {c}, which is not a workspace crate"
            );
        }
    }
    let bad = disallowed_edges(&meta.edges, &meta.crates);
    assert!(
        bad.is_empty(),
        "{} dependency edge(s) between Tether crates break the layering:\n  {}\n\
         The allowed edges are ALLOWED_NORMAL_DEPS and ALLOWED_BUILD_DEPS at the top of {THIS_FILE}; \
         change them only with the design.",
        bad.len(),
        bad.join("\n  ")
    );
}

#[test]
fn no_tether_crate_depends_on_tether_cli_in_any_dependency_kind() {
    let meta = metadata();
    let upward: Vec<String> = meta
        .edges
        .iter()
        .filter(|e| e.to == "tether-cli")
        .map(|e| format!("{} → tether-cli ({})", e.from, e.kind.describe()))
        .collect();
    assert!(
        upward.is_empty(),
        "tether-cli is the top of the graph; nothing may depend on it, not even for tests:\n  {}",
        upward.join("\n  ")
    );
}

// --- 2. Authorized::mint ---------------------------------------------------

#[test]
fn only_tether_kernel_src_calls_authorized_mint() {
    let scan = workspace_scan();
    assert_no_scan_errors(scan, "Authorized::mint", |_| true);
    assert!(
        scan.files.len() >= MIN_FILES_ALL,
        "the scan read {} .rs files under crates/, fewer than {MIN_FILES_ALL}: it has degraded",
        scan.files.len()
    );
    // The scan must see what it guards: the definition, and the kernel's own calls by each layer.
    let kernel: Vec<&FileReport> = scan.under("crates/tether-kernel/src/").collect();
    let defs: usize = kernel.iter().map(|f| f.mint.definitions.len()).sum();
    let by_syn: usize = kernel.iter().map(|f| f.mint.syn_calls.len()).sum();
    let by_tokens: usize = kernel.iter().map(|f| f.mint.token_calls.len()).sum();
    let by_text: usize = kernel.iter().map(|f| f.mint.text_calls.len()).sum();
    assert!(
        defs >= 1 && by_syn >= 1 && by_tokens >= 1 && by_text >= 1,
        "the scan has degraded: in crates/tether-kernel/src it found {defs} definition(s) of \
         `fn mint` in `impl Authorized` and {by_syn}/{by_tokens}/{by_text} call(s) by syntax \
         tree/tokens/text; each must be at least 1"
    );
    // Each listed compile-fail fixture exists, is a fixture, and still spells the call.
    let root = workspace_root();
    for fixture in MINT_COMPILE_FAIL_FIXTURES {
        let f = scan.files.iter().find(|f| f.rel == *fixture);
        let stderr = root.join(fixture).with_extension("stderr");
        assert!(
            f.is_some_and(|f| !f.mint.all_calls().is_empty()) && stderr.is_file(),
            "MINT_COMPILE_FAIL_FIXTURES in {THIS_FILE} lists {fixture}, which is gone, has no \
             .stderr beside it, or no longer calls Authorized::mint: remove the stale exemption"
        );
    }
    let mut offenders = Vec::new();
    for f in &scan.files {
        if f.rel.starts_with("crates/tether-kernel/src/")
            || MINT_COMPILE_FAIL_FIXTURES.contains(&f.rel.as_str())
        {
            continue;
        }
        for h in f.mint.all_calls() {
            offenders.push(format!("{}:{}: {}", f.rel, h.line, h.what));
        }
    }
    assert!(
        offenders.is_empty(),
        "Authorized::mint, the sealed witness's constructor, is named outside \
         crates/tether-kernel/src:\n  {}\nOnly the kernel may mint the proof that the evaluation \
         order ran.",
        offenders.join("\n  ")
    );
}

// --- 3. tether-server and tether-store -------------------------------------

#[test]
fn tether_server_names_no_tether_store_item() {
    let scan = workspace_scan();
    let prefix = "crates/tether-server/src/";
    assert_no_scan_errors(scan, "tether-server", |rel| rel.starts_with(prefix));
    let files: Vec<&FileReport> = scan.under(prefix).collect();
    assert!(
        files.len() >= MIN_FILES_SERVER_SRC,
        "the scan read {} files under {prefix}, fewer than {MIN_FILES_SERVER_SRC}: it has degraded",
        files.len()
    );
    let offenders: Vec<String> = files
        .iter()
        .flat_map(|f| {
            f.store_paths
                .iter()
                .map(move |h| format!("{}:{}: {}", f.rel, h.line, h.what))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "tether-server names tether_store in {} place(s); the server reaches durable state \
         through the kernel only:\n  {}",
        offenders.len(),
        offenders.join("\n  ")
    );
}

#[test]
fn tether_server_depends_on_tether_store_only_as_a_dev_dependency() {
    let meta = metadata();
    let bad: Vec<String> = meta
        .edges
        .iter()
        .filter(|e| e.from == "tether-server" && e.to == "tether-store" && e.kind != DepKind::Dev)
        .map(|e| format!("tether-server → tether-store as a {}", e.kind.describe()))
        .collect();
    assert!(
        bad.is_empty(),
        "crates/tether-server/Cargo.toml declares tether-store other than as a dev-dependency:\n  {}",
        bad.join("\n  ")
    );
}

// --- 4. sizes --------------------------------------------------------------

fn assert_src_scan_complete(scan: &WorkspaceScan, what: &str) {
    assert_no_scan_errors(scan, what, is_src_path);
    let n = scan.non_test_src().count();
    assert!(
        n >= MIN_FILES_SRC,
        "the {what} scan read {n} non-test files under crates/*/src, fewer than {MIN_FILES_SRC}: \
         it has degraded"
    );
}

#[test]
fn no_non_test_source_file_is_longer_than_900_lines() {
    let scan = workspace_scan();
    assert_src_scan_complete(scan, "file size");
    let mut offenders: Vec<String> = scan
        .non_test_src()
        .filter(|f| f.sizes.counted_lines() > MAX_FILE_LINES)
        .map(|f| {
            format!(
                "{}: {} lines ({} in all, {} in #[cfg(test)] items)",
                f.rel,
                f.sizes.counted_lines(),
                f.sizes.total_lines,
                f.sizes.test_lines
            )
        })
        .collect();
    offenders.sort();
    assert!(
        offenders.is_empty(),
        "{} non-test source file(s) are longer than {MAX_FILE_LINES} lines (not counting \
         #[cfg(test)] items):\n  {}",
        offenders.len(),
        offenders.join("\n  ")
    );
}

#[test]
fn no_non_test_function_is_longer_than_100_lines() {
    let scan = workspace_scan();
    assert_src_scan_complete(scan, "function size");
    let fns: usize = scan.non_test_src().map(|f| f.sizes.fns.len()).sum();
    assert!(
        fns >= MIN_FNS_SRC,
        "the scan found {fns} non-test functions under crates/*/src, fewer than {MIN_FNS_SRC}: \
         it has degraded"
    );
    let mut offenders: Vec<(String, usize, String)> = Vec::new();
    for f in scan.non_test_src() {
        for func in f.sizes.fns.iter().filter(|x| x.lines > MAX_FN_LINES) {
            offenders.push((
                f.rel.clone(),
                func.line,
                format!(
                    "{}:{}: {} — {} lines",
                    f.rel, func.line, func.name, func.lines
                ),
            ));
        }
    }
    offenders.sort();
    let lines: Vec<String> = offenders.into_iter().map(|(_, _, m)| m).collect();
    assert!(
        lines.is_empty(),
        "{} non-test function(s) are longer than {MAX_FN_LINES} lines (signature to closing \
         brace):\n  {}",
        lines.len(),
        lines.join("\n  ")
    );
}

// --- 5. MHS code literals --------------------------------------------------

#[test]
fn no_mhs_code_literal_appears_outside_tether_core_src() {
    let scan = workspace_scan();
    assert_src_scan_complete(scan, "MHS literal");
    let mut offenders = Vec::new();
    for f in scan
        .non_test_src()
        .filter(|f| !f.rel.starts_with("crates/tether-core/src/"))
    {
        for h in &f.mhs {
            offenders.push(format!("{}:{}: {}", f.rel, h.line, h.what));
        }
    }
    assert!(
        offenders.is_empty(),
        "{} \"MHS.…\" string literal(s) in non-test code outside crates/tether-core/src; take \
         the code from the registry (tether_core::Code, the NOT_CERTIFIED constants):\n  {}",
        offenders.len(),
        offenders.join("\n  ")
    );
}

// --- 6. READMEs ------------------------------------------------------------

#[test]
fn every_crate_readme_states_its_tether_dependencies_as_cargo_metadata_does() {
    let meta = metadata();
    let root = workspace_root();
    let mut problems = Vec::new();
    for (name, dir) in &meta.crates {
        let path = format!("{dir}/README.md");
        let readme = match std::fs::read_to_string(root.join(&path)) {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!("{path}: cannot be read: {e}"));
                continue;
            }
        };
        let checks = [
            ("**Depends on:**", meta.normal_deps_of(name)),
            ("**Depended on by:**", meta.normal_dependents_of(name)),
        ];
        for (marker, actual) in checks {
            match readme_set(&readme, marker) {
                Err(e) => problems.push(format!(
                    "{path}: {e}; cargo metadata says {marker} {}",
                    fmt_set(&actual)
                )),
                Ok(stated) if stated != actual => problems.push(format!(
                    "{path}: {marker} states {{{}}}, cargo metadata (normal dependencies) says {{{}}}",
                    fmt_set(&stated),
                    fmt_set(&actual)
                )),
                Ok(_) => {}
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} README dependency line(s) disagree with cargo metadata (each README needs a line \
         beginning `**Depends on:**` and one beginning `**Depended on by:**`; the Tether crates \
         before the first `;`, or `nothing`):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

// --- 7. the kernel's store -------------------------------------------------

#[test]
fn tether_kernel_exposes_no_public_store_accessor() {
    let scan = workspace_scan();
    let prefix = "crates/tether-kernel/src/";
    assert_no_scan_errors(scan, "Kernel store", |rel| rel.starts_with(prefix));
    let files: Vec<&FileReport> = scan.under(prefix).collect();
    let structs: usize = files.iter().map(|f| f.kernel.kernel_struct.len()).sum();
    let impls: usize = files.iter().map(|f| f.kernel.impl_kernel).sum();
    assert!(
        structs == 1 && impls >= 1,
        "the scan has degraded: under {prefix} it found {structs} `struct Kernel` (expected 1) \
         and {impls} `impl Kernel` blocks (expected at least 1)"
    );
    let offenders: Vec<String> = files
        .iter()
        .flat_map(|f| {
            f.kernel
                .pub_store
                .iter()
                .map(move |h| format!("{}:{}: {}", f.rel, h.line, h.what))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "the kernel hands its store to other crates; keep the accessor `pub(crate)` and give \
         surfaces what they need through kernel methods:\n  {}",
        offenders.join("\n  ")
    );
}

// ===========================================================================
// The gates can fail: each scanner on synthetic source
// ===========================================================================

fn parse_ok(src: &str) -> syn::File {
    parse("synthetic.rs", src).unwrap_or_else(|e| panic!("{e}\n{src}"))
}

/// Lines of `src` carrying the marker comment `// HIT`.
fn marked_lines(src: &str) -> BTreeSet<usize> {
    src.lines()
        .enumerate()
        .filter(|(_, l)| l.ends_with("// HIT"))
        .map(|(i, _)| i + 1)
        .collect()
}

fn lines_of(hits: &[Hit]) -> BTreeSet<usize> {
    hits.iter().map(|h| h.line).collect()
}

#[test]
fn the_parser_reports_a_file_that_does_not_parse_with_its_line() {
    let err = parse("broken.rs", "fn ok() {}\nfn broken( {\n")
        .err()
        .expect("a broken file must not parse");
    assert!(err.starts_with("broken.rs:"), "{err}");
    assert!(err.contains("does not parse"), "{err}");
}

#[test]
fn the_dependency_check_flags_an_edge_outside_the_allowlist_and_no_other() {
    let mut crates: BTreeMap<String, String> = EXPECTED_CRATES
        .iter()
        .map(|c| ((*c).to_owned(), format!("crates/{c}")))
        .collect();
    let edge = |from: &str, to: &str, kind| Edge {
        from: from.to_owned(),
        to: to.to_owned(),
        kind,
    };
    let allowed = vec![
        edge("tether-store", "tether-core", DepKind::Normal),
        edge("tether-server", "tether-kernel", DepKind::Normal),
        edge("tether-cli", "tether-store", DepKind::Normal),
        edge("tether-kernel", "tether-drivers", DepKind::Dev),
    ];
    assert_eq!(disallowed_edges(&allowed, &crates), Vec::<String>::new());
    let mut edges = allowed;
    edges.push(edge("tether-drivers", "tether-store", DepKind::Normal));
    edges.push(edge("tether-core", "tether-core", DepKind::Build));
    crates.insert("tether-new".to_owned(), "crates/tether-new".to_owned());
    let bad = disallowed_edges(&edges, &crates);
    assert_eq!(bad.len(), 3, "{bad:#?}");
    assert!(bad
        .iter()
        .any(|b| b.starts_with("tether-new is a workspace crate with no entry")));
    assert!(bad.iter().any(|b| b.starts_with(
        "tether-drivers → tether-store: a normal dependency ([dependencies]) declared in \
         crates/tether-drivers/Cargo.toml, not in ALLOWED_NORMAL_DEPS"
    )));
    assert!(bad.iter().any(|b| b.contains("not in ALLOWED_BUILD_DEPS")));

    let json: Value = serde_json::json!({"packages": [
        {"name": "tether-a", "manifest_path": "/w/crates/tether-a/Cargo.toml", "dependencies": [
            {"name": "tether-b", "kind": null},
            {"name": "tether-b", "kind": "dev"},
            {"name": "tether-b", "kind": "build"},
            {"name": "serde", "kind": null}
        ]},
        {"name": "tether-b", "manifest_path": "/w/crates/tether-b/Cargo.toml", "dependencies": []}
    ]});
    let meta = parse_metadata(&json, Path::new("/w")).unwrap();
    assert_eq!(meta.crates["tether-a"], "crates/tether-a");
    let kinds: Vec<DepKind> = meta.edges.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, vec![DepKind::Normal, DepKind::Build, DepKind::Dev]);
}

#[test]
fn the_mint_scanner_flags_every_spelling_of_a_mint_call_and_nothing_else() {
    // `AUTH` becomes `Authorized` at run time, so this file never spells the call.
    let src = r#"
use crate::authorized::AUTH;
use crate::authorized::AUTH as Witness;
type Alias = AUTH;
impl AUTH {
    pub(crate) fn mint() -> Self { todo!() }
    fn again() -> Self { Self::mint() } // HIT
}
fn a() { let _ = AUTH::mint(1); } // HIT
fn b() { let _ = crate::authorized::AUTH::mint(1); } // HIT
fn c() { let _ = <AUTH>::mint(1); } // HIT
fn d() { let _ = Witness::mint(1); } // HIT
fn e() { let f = AUTH::mint; } // HIT
fn g() { let v = vec![AUTH::mint(1)]; } // HIT
fn h() { let _ = Alias::mint(1); } // HIT
fn i() { let _ = AUTH :: mint (1); } // HIT
fn j() { let _ = <AUTH as Tr>::mint(1); } // HIT
fn n1() { let _ = Other::mint(1); }
fn n2() { let _ = AUTH::new(1); }
fn n3() { let _ = mint(1); }
// AUTH::mint( in a comment
/// AUTH::mint( in a doc comment
fn n4() {}
impl Other { fn mint() {} fn x() { Self::mint() } }
"#
    .replace("AUTH", "Authorized");
    let scan = scan_mint(&parse_ok(&src), &src);
    assert_eq!(scan.definitions, vec![6]);
    assert_eq!(lines_of(&scan.all_calls()), marked_lines(&src), "{scan:#?}");
    // Each layer sees its part: the tree misses macro bodies, tokens miss
    // `Self::mint`, text misses renames.
    assert_eq!(
        lines_of(&scan.syn_calls),
        BTreeSet::from([7, 9, 10, 11, 12, 13, 15, 16, 17])
    );
    assert_eq!(
        lines_of(&scan.token_calls),
        BTreeSet::from([9, 10, 11, 12, 13, 14, 15, 16])
    );
    assert_eq!(
        lines_of(&scan.text_calls),
        BTreeSet::from([9, 10, 11, 14, 16])
    );
}

#[test]
fn the_store_path_scanner_flags_every_way_of_naming_the_crate_and_nothing_else() {
    let src = r#"
use tether_store::Store; // HIT
use {std::fmt, tether_store::canonical}; // HIT
use ::tether_store::MemoryStore; // HIT
extern crate tether_store; // HIT
fn f(_: tether_store::StoreError) {} // HIT
fn g() { let _ = ::tether_store::MemoryStore::new(); } // HIT
fn h() { println!("{}", tether_store::MAX); } // HIT
fn k() { tether_store::some_macro!(); } // HIT
fn n1() { let _ = tether_storage::X; }
fn n2() { let tether_store_like = my::tether_store_x; }
// use tether_store::Store; in a comment
/// tether_store in a doc comment
fn n3() {}
#[cfg(test)]
mod tests {
    use tether_store::MemoryStore; // HIT
}
"#;
    let hits = scan_crate_paths(&parse_ok(src), src, "tether_store");
    assert_eq!(lines_of(&hits), marked_lines(src), "{hits:#?}");
    let last = hits.last().unwrap();
    assert!(last.what.ends_with("(test code)"), "{last:?}");
    assert!(!hits[0].what.contains("test code"), "{:?}", hits[0]);
}

#[test]
fn the_size_scanner_measures_fns_from_signature_to_closing_brace_and_skips_tests() {
    let body = |n: usize| "    let _ = 1;\n".repeat(n);
    let mut src = String::new();
    // 1 + 98 + 1 = 100 lines: at the bound. Doc and attribute lines do not count.
    src += &format!(
        "/// Doc.\n#[inline]\npub fn at_limit() {{\n{}}}\n",
        body(98)
    );
    src += &format!("fn one_over() {{\n{}}}\n", body(99));
    src += "pub(crate) fn multi_line(\n    a: u8,\n) -> u8 {\n    a\n}\n";
    src += &format!(
        "struct S;\nimpl S {{\n    /// Doc.\n    pub fn method(&self) {{\n{}    }}\n}}\n",
        body(99)
    );
    src += &format!(
        "trait T {{\n    fn required(&self);\n    fn provided(&self) {{\n{}    }}\n}}\n",
        body(99)
    );
    src += &format!("fn outer() {{\n    fn inner() {{\n{}    }}\n}}\n", body(99));
    src += &format!("#[test]\nfn long_test() {{\n{}}}\n", body(200));
    src += &format!(
        "#[tokio::test]\nasync fn long_async_test() {{\n{}}}\n",
        body(200)
    );
    let before_tests = src.lines().count();
    let test_mod = format!(
        "#[cfg(test)]\nmod tests {{\n    fn long_helper() {{\n{}    }}\n}}\n",
        body(200)
    );
    src += &test_mod;
    src += "#[cfg(test)]\nmod more;\n#[cfg(all(test, unix))]\nmod unix_tests;\n#[cfg(not(test))]\nmod prod;\n";
    let sizes = scan_sizes(&parse_ok(&src), &src);

    let got: BTreeMap<&str, usize> = sizes
        .fns
        .iter()
        .map(|f| (f.name.as_str(), f.lines))
        .collect();
    let want = BTreeMap::from([
        ("at_limit", 100),
        ("one_over", 101),
        ("multi_line", 5),
        ("S::method", 101),
        ("T::provided", 101),
        ("outer", 103),
        ("inner (nested in outer)", 101),
    ]);
    assert_eq!(got, want, "{sizes:#?}");
    assert_eq!(
        sizes
            .fns
            .iter()
            .find(|f| f.name == "at_limit")
            .unwrap()
            .line,
        3
    );
    let over: Vec<&str> = sizes
        .fns
        .iter()
        .filter(|f| f.lines > MAX_FN_LINES)
        .map(|f| f.name.as_str())
        .collect();
    assert!(
        !over.contains(&"at_limit") && over.contains(&"one_over"),
        "{over:?}"
    );

    assert_eq!(sizes.total_lines, src.lines().count());
    // The test module (with its attribute) and the two out-of-line test
    // module declarations (two lines each); `cfg(not(test))` stays counted.
    assert_eq!(sizes.test_lines, test_mod.lines().count() + 4);
    assert_eq!(sizes.counted_lines(), before_tests + 2);
    let mods: Vec<&str> = sizes.test_mods.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(mods, vec!["more", "unix_tests"]);
    let m = &sizes.test_mods[0];
    let cands = module_file_candidates(Path::new("/c/src/lib.rs"), m);
    assert_eq!(cands[0], Path::new("/c/src/more.rs"));
    let cands = module_file_candidates(Path::new("/c/src/policy.rs"), m);
    assert_eq!(cands[0], Path::new("/c/src/policy/more.rs"));
}

#[test]
fn the_mhs_scanner_flags_code_literals_in_code_macros_and_attributes_but_not_docs_or_tests() {
    let src = r###"
fn a() -> &'static str { "MHS.SAFETY.X" } // HIT
fn b() -> String { format!("{}", "MHS.PROTOCOL.Y") } // HIT
fn c() -> Value { json!({"error": {"mhs_code": "MHS.OUTCOME.Z"}}) } // HIT
enum E { #[error("MHS.E.W")] W } // HIT
const R: &str = r#"MHS.RAW"#; // HIT
impl S { fn m(&self) -> &str { self.x.unwrap_or("MHS.PROTOCOL.INTERNAL") } } // HIT
/// "MHS.DOC" in a doc comment
// "MHS.COMMENT" in a comment
fn n() -> &'static str { "see MHS.X" }
const B: &[u8] = b"MHS.BYTES";
#[test]
fn t() { let _ = "MHS.T"; }
impl S {
    #[cfg(test)]
    fn helper() -> &'static str { "MHS.T" }
}
#[cfg(test)]
mod tests {
    const T: &str = "MHS.T";
    fn f() { assert_eq!(x, json!("MHS.T")); }
}
"###;
    let hits = scan_mhs_literals(&parse_ok(src));
    assert_eq!(lines_of(&hits), marked_lines(src), "{hits:#?}");
    assert_eq!(hits[0].what, "\"MHS.SAFETY.X\"");
}

#[test]
fn the_kernel_scanner_flags_a_public_store_accessor_but_not_a_crate_private_one() {
    let src = r"
pub struct Kernel;
impl Kernel {
    pub fn store(&self) -> &Store { &self.store } // HIT
    pub(crate) fn store_inner(&self) {}
}
impl Kernel { pub(crate) fn store(&self) {} }
impl<T> Kernel<T> {
    pub
    fn store(&self) {} // HIT
}
impl Other { fn store(&self) {} }
";
    let scan = scan_kernel_store(&parse_ok(src), src);
    assert_eq!(scan.kernel_struct, vec![2]);
    assert_eq!(scan.impl_kernel, 3);
    assert_eq!(lines_of(&scan.pub_store), marked_lines(src), "{scan:#?}");
}

#[test]
fn the_readme_reader_takes_the_crates_before_the_first_semicolon_or_nothing() {
    let readme = "# x\n\n**Depends on:** tether-core, `tether-kernel` (the trait); and \
                  tether-drivers after the semicolon\n  **Depended on by:** nothing.\n";
    let set = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
    assert_eq!(
        readme_set(readme, "**Depends on:**").unwrap(),
        set(&["tether-core", "tether-kernel"])
    );
    assert_eq!(readme_set(readme, "**Depended on by:**").unwrap(), set(&[]));
    // Same line for both markers: the second does not begin a line.
    let one_line = "**Depends on:** tether-core. **Depended on by:** nothing.\n";
    assert!(readme_set(one_line, "**Depended on by:**").is_err());
    assert!(readme_set("**Depends on:** serde only\n", "**Depends on:**").is_err());
    assert!(readme_set("Depends on tether-core\n", "**Depends on:**").is_err());
}
