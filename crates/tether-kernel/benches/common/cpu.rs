//! Process CPU time, for benches that report CPU per command. Shared by the
//! kernel's and the server's load benches (the server's includes this file).

/// User + system CPU time of this process so far (Linux: /proc/self/stat;
/// `None` elsewhere). Clock ticks are taken as 100 per second, the value on
/// every mainstream Linux build. Throughput on a shared 2-core machine swings
/// by ±20% between runs; CPU per command is the steadier figure to compare.
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 here.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}
