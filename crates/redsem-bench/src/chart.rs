//! SVG charts of the `base` scenario: the wait-time CDF per design, and the number of holders
//! over time per design.
//!
//! plotters is used with its SVG backend only and without its `ttf`/`ab_glyph` features, so
//! no font library is linked: text is written as SVG `<text>` elements that the viewer
//! renders with its own fonts, and plotters' built-in "naive" font only estimates label sizes
//! for the layout (a unit test checks that the labels are really in the file).

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::metrics;
use crate::scenarios::{ScenarioKind, ScenarioResult};

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

type DrawResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Left end of the CDF's logarithmic wait axis, ms.
const FLOOR_MS: f64 = 0.1;

/// Width of the bins of the holders chart's time-weighted mean, s.
const BIN_S: f64 = 0.05;

/// Writes `base-wait-cdf.svg` and `base-holders.svg` into `dir` when the results contain the
/// base scenario; returns the files written.
pub fn write_charts(results: &[ScenarioResult], dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let base: Vec<&ScenarioResult> = results
        .iter()
        .filter(|r| r.scenario == ScenarioKind::Base && r.skipped.is_none() && !r.reps.is_empty())
        .collect();
    if base.is_empty() {
        return Ok(vec![]);
    }
    std::fs::create_dir_all(dir)?;
    let cdf = dir.join("base-wait-cdf.svg");
    wait_cdf(&base, &cdf).map_err(|e| anyhow::anyhow!("drawing {}: {e}", cdf.display()))?;
    let holders = dir.join("base-holders.svg");
    holders_over_time(&base, &holders)
        .map_err(|e| anyhow::anyhow!("drawing {}: {e}", holders.display()))?;
    Ok(vec![cdf, holders])
}

/// Wait-time CDF, all repetitions of a design pooled, one line per design.
fn wait_cdf(base: &[&ScenarioResult], path: &Path) -> DrawResult<()> {
    let series: Vec<(String, Vec<f64>)> = base
        .iter()
        .map(|r| {
            let mut w: Vec<f64> = r
                .reps
                .iter()
                .flat_map(|x| x.jobs.iter().map(|j| j.wait_ms))
                .collect();
            w.sort_by(f64::total_cmp);
            (r.design.to_string(), w)
        })
        .filter(|(_, w)| !w.is_empty())
        .collect();
    let xmax = series
        .iter()
        .filter_map(|(_, w)| w.last().copied())
        .fold(1.0f64, f64::max)
        * 1.02;
    let root = SVGBackend::new(path, (960, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let params = &base[0].params;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Wait time CDF, base scenario ({} x {} tasks, limit {}, {} ms hold)",
                params.procs, params.workers, params.limit, params.hold_ms
            ),
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((FLOOR_MS..xmax).log_scale(), 0f64..1.0)?;
    chart
        .configure_mesh()
        .x_desc("wait inside acquire(), ms (log scale; waits below 0.1 ms drawn at 0.1)")
        .y_desc("fraction of jobs")
        .draw()?;
    for (i, (name, w)) in series.iter().enumerate() {
        let n = w.len() as f64;
        let mut pts = vec![(FLOOR_MS, 0.0)];
        for (k, &v) in w.iter().enumerate() {
            let v = v.max(FLOOR_MS);
            pts.push((v, k as f64 / n));
            pts.push((v, (k + 1) as f64 / n));
        }
        let c = color(i);
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Holders over time (first repetition), one panel per design, the limit as a red line.
fn holders_over_time(base: &[&ScenarioResult], path: &Path) -> DrawResult<()> {
    let panel_h = 170u32;
    let root = SVGBackend::new(path, (960, 60 + panel_h * base.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let params = &base[0].params;
    let root = root.titled(
        &format!(
            "Holders over time, base scenario, first repetition (limit {}; thin: exact, thick: mean per {} ms)",
            params.limit,
            BIN_S * 1000.0
        ),
        ("sans-serif", 18),
    )?;
    let panels = root.split_evenly((base.len(), 1));
    let tmax = base
        .iter()
        .filter_map(|r| {
            let rep = r.reps.first()?;
            let end = rep.jobs.iter().map(|j| j.rel_ns).max()?;
            Some(end.saturating_sub(rep.start_ns) as f64 / 1e9)
        })
        .fold(0.1f64, f64::max)
        * 1.02;
    let ymax = f64::from(params.limit) + 1.5;
    for (i, (r, area)) in base.iter().zip(panels.iter()).enumerate() {
        let rep = &r.reps[0];
        let intervals: Vec<(u64, u64)> = rep.jobs.iter().map(|j| (j.acq_ns, j.rel_ns)).collect();
        let t = |ns: u64| ns.saturating_sub(rep.start_ns) as f64 / 1e9;
        let timeline: Vec<(f64, usize)> = metrics::holders_timeline(&intervals)
            .into_iter()
            .map(|(ns, n)| (t(ns), n))
            .collect();
        let mut pts = vec![(0.0, 0.0)];
        let mut prev = 0usize;
        for &(x, n) in &timeline {
            pts.push((x, prev as f64));
            pts.push((x, n as f64));
            prev = n;
        }
        let end_t = timeline.last().map_or(0.0, |&(x, _)| x);
        let mut means = binned_mean(&timeline, BIN_S, tmax);
        means.retain(|&(centre, _)| centre - BIN_S / 2.0 < end_t);
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("{} (max {})", r.design, metrics::max_overlap(&intervals)),
                ("sans-serif", 15),
            )
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..tmax, 0f64..ymax)?;
        chart
            .configure_mesh()
            .x_desc("s since start")
            .y_desc("holders")
            .y_labels(params.limit as usize + 2)
            .draw()?;
        chart.draw_series(LineSeries::new(
            [
                (0.0, f64::from(params.limit)),
                (tmax, f64::from(params.limit)),
            ],
            RED.stroke_width(1),
        ))?;
        chart.draw_series(LineSeries::new(pts, color(i).mix(0.3).stroke_width(1)))?;
        chart.draw_series(LineSeries::new(means, color(i).stroke_width(3)))?;
    }
    root.present()?;
    Ok(())
}

/// Time-weighted mean of a step function `(t, value from t on)` over bins of `width` from 0
/// to `end`, as `(bin centre, mean)`.
fn binned_mean(timeline: &[(f64, usize)], width: f64, end: f64) -> Vec<(f64, f64)> {
    let nbins = (end / width).ceil().max(1.0) as usize;
    let mut area = vec![0.0f64; nbins];
    let mut add = |from: f64, to: f64, v: f64| {
        let mut a = from.max(0.0);
        while a < to {
            let mut b = ((a / width).floor() + 1.0) * width;
            if b <= a {
                // `a` sits on a bin boundary and the division rounded down: next bin
                b = ((a / width).floor() + 2.0) * width;
            }
            let seg_end = b.min(to);
            let k = ((a / width).floor() as usize).min(nbins - 1);
            area[k] += (seg_end - a) * v;
            a = seg_end;
        }
    };
    let mut prev_t = 0.0;
    let mut prev_v = 0usize;
    for &(t, v) in timeline {
        add(prev_t, t.min(end), prev_v as f64);
        prev_t = t.min(end);
        prev_v = v;
    }
    add(prev_t, end, prev_v as f64);
    area.iter()
        .enumerate()
        .map(|(k, a)| ((k as f64 + 0.5) * width, a / width))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn binned_mean_ends_on_bin_boundaries_that_round_down() {
        // 0.15 / 0.05 = 2.9999999999999996: without care the bin walk never advanced
        let timeline = [(0.15000000000000002, 1usize), (0.3, 2), (0.45, 0)];
        let means = super::binned_mean(&timeline, 0.05, 0.5);
        assert_eq!(means.len(), 10);
        assert!((means[4].1 - 1.0).abs() < 1e-9, "{means:?}");
        assert!((means[7].1 - 2.0).abs() < 1e-9, "{means:?}");
    }

    #[test]
    fn binned_mean_is_time_weighted() {
        // 2 holders from 0.0 to 0.05, 0 from 0.05 to 0.075, 4 from 0.075 on
        let m = super::binned_mean(&[(0.0, 2), (0.05, 0), (0.075, 4)], 0.05, 0.1);
        assert_eq!(m.len(), 2);
        assert!((m[0].1 - 2.0).abs() < 1e-9, "{m:?}");
        assert!((m[1].1 - 2.0).abs() < 1e-9, "{m:?}");
    }

    use super::*;
    use crate::designs::DesignKind;
    use crate::metrics::JobRecord;
    use crate::scenarios::{RepResult, ScenarioParams};

    #[test]
    fn svg_contains_text_labels() {
        let start = 1_000_000_000u64;
        let jobs: Vec<JobRecord> = (0..50u64)
            .map(|i| JobRecord {
                wait_ms: i as f64,
                acq_ns: start + i * 20_000_000,
                rel_ns: start + i * 20_000_000 + 15_000_000,
                req_ns: None,
                done_ns: None,
                errors: 0,
                worker: None,
                proc: 0,
            })
            .collect();
        let r = ScenarioResult {
            scenario: ScenarioKind::Base,
            design: DesignKind::FifoNotify,
            description: String::new(),
            params: ScenarioParams {
                procs: 3,
                workers: 10,
                jobs_per_proc: 200,
                limit: 5,
                hold_ms: 20.0,
                lease_ms: 5000,
                run_timeout_s: 30.0,
                ..ScenarioParams::default()
            },
            skipped: None,
            reps: vec![RepResult {
                jobs,
                start_ns: start,
                ..Default::default()
            }],
            agg: Default::default(),
            all_complete: true,
            any_timeout: false,
        };
        let dir = tempfile::tempdir().unwrap();
        let files = write_charts(&[r], dir.path()).unwrap();
        assert_eq!(files.len(), 2);
        for f in files {
            let svg = std::fs::read_to_string(&f).unwrap();
            assert!(svg.contains("<text"), "{}", f.display());
            assert!(svg.contains("fifo-notify"), "{}", f.display());
        }
    }
}
