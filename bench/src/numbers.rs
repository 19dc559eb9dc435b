//! Numbers as the reports give them: rounded to one decimal, in percent, the median of a list,
//! a list written out. A leaf: it imports no other module.

/// To one decimal.
pub(crate) fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// A fraction in percent, to one decimal.
pub(crate) fn percent(fraction: f64) -> f64 {
    round1(fraction * 100.0)
}

/// The median of `v` (0 for none).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `v` as `digits`-decimal numbers, comma-separated (the report tables').
pub(crate) fn list(v: &[f64], digits: usize) -> String {
    v.iter()
        .map(|c| format!("{c:.digits$}"))
        .collect::<Vec<_>>()
        .join(", ")
}
