//! Gaussian-process Bayesian optimization (`method: bayes`), after Optuna's GP sampler: the
//! finished trials' parameters mapped into the unit cube (log parameters on their log scale,
//! integers and quantized values by their cells, categoricals by index), their objectives
//! standardized, a Matérn-5/2 GP with per-parameter length scales fitted to them, and the next
//! trial where the log expected improvement over the best value is highest.
//!
//! Running trials (`parallel` > 1) are handled by the kriging believer: each is added to the
//! GP as if it had come in at the GP's own prediction there, which leaves the prediction as it
//! was but takes away the uncertainty around it, so the next suggestion goes elsewhere.

mod acq;
mod model;

use acq::{Acq, Coord};

use crate::dims::{self, Dim, Kind};
use crate::history::{history, Finished};
use crate::spec::SweepSpec;
use crate::stats::{rng_for, STREAM_PARAMS};
use crate::tpe::{self, STARTUP_TRIALS};
use crate::{Params, Trial};

/// Where kernel-parameter fits start: (inverse squared length scale, scale, noise). The first
/// is Optuna's default start; the second starts smooth and nearly noiseless.
const FIT_STARTS: [(f64, f64, f64); 2] = [(1.0, 1.0, 1.0), (0.25, 1.0, 0.01)];
/// Above this many observations one fit start is enough (and keeps a suggestion fast).
const ONE_START_ABOVE: usize = 100;
/// The most finished trials the GP models, of which the best `KEEP_BEST` always.
const MAX_MODELLED: usize = 250;
const KEEP_BEST: usize = 100;

/// The point of `x` (internal-axis values) in the unit cube.
fn normalize(dims: &[Dim], x: &[f64]) -> Vec<f64> {
    dims.iter()
        .zip(x)
        .map(|(d, &v)| match d.kind {
            Kind::Cat(_) => v,
            Kind::Num { lo, hi, .. } => ((v - lo) / (hi - lo)).clamp(0.0, 1.0),
        })
        .collect()
}

/// The internal-axis point of a unit-cube point.
fn denormalize(dims: &[Dim], u: &[f64]) -> Vec<f64> {
    dims.iter()
        .zip(u)
        .map(|(d, &v)| match d.kind {
            Kind::Cat(_) => d.snap(v),
            Kind::Num { lo, hi, .. } => d.snap(lo + v * (hi - lo)),
        })
        .collect()
}

fn coord(d: &Dim) -> Coord {
    match d.kind {
        Kind::Cat(k) => Coord::Cat(k),
        Kind::Num { grid: None, .. } => Coord::Cont,
        Kind::Num {
            lo,
            hi,
            log,
            grid: Some(grid),
        } => Coord::Grid { grid, log, lo, hi },
    }
}

/// A trial's unit-cube point, when every searched parameter has a value the space can produce.
fn full_point(dims: &[Dim], t: &Trial) -> Option<Vec<f64>> {
    let p: Option<Vec<f64>> = dims::point(dims, t).into_iter().collect();
    p.map(|p| normalize(dims, &p))
}

pub(crate) fn suggest(spec: &SweepSpec, earlier: &[&Trial], number: u32) -> Params {
    let dims = dims::dims(spec);
    let h = history(spec, earlier);
    let mut modelled: Vec<(&Finished, Vec<f64>)> = h
        .finished
        .iter()
        .filter_map(|f| full_point(&dims, f.trial).map(|p| (f, p)))
        .collect();
    // A GP's fit grows with the cube of its trials: past MAX_MODELLED, the best KEEP_BEST and
    // the most recent of the others are modelled.
    if modelled.len() > MAX_MODELLED {
        let mut rest = modelled.split_off(KEEP_BEST);
        rest.sort_by_key(|(f, _)| std::cmp::Reverse(f.trial.number));
        rest.truncate(MAX_MODELLED - KEEP_BEST);
        modelled.extend(rest);
    }
    let mut xs = Vec::with_capacity(modelled.len());
    let mut ys = Vec::with_capacity(modelled.len());
    for (f, p) in modelled {
        xs.push(p);
        // The GP maximizes.
        ys.push(-f.value);
    }
    // Until enough trials fit the current space whole (start-up, or a spec changed
    // mid-sweep), TPE decides: it starts with random search and can use partial history.
    if dims.is_empty() || xs.len() < STARTUP_TRIALS {
        return tpe::suggest(spec, earlier, number);
    }
    let mut rng = rng_for(spec.seed, number.into(), STREAM_PARAMS);
    let n = ys.len() as f64;
    let mean = ys.iter().sum::<f64>() / n;
    let std = (ys.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / n).sqrt();
    for y in &mut ys {
        *y = (*y - mean) / std.max(1e-10);
    }
    let cat: Vec<bool> = dims
        .iter()
        .map(|d| matches!(d.kind, Kind::Cat(_)))
        .collect();
    let coords: Vec<Coord> = dims.iter().map(coord).collect();
    let starts = if xs.len() > ONE_START_ABOVE {
        &FIT_STARTS[..1]
    } else {
        &FIT_STARTS[..]
    };
    let hyper = model::fit(&xs, &ys, &cat, starts);
    let mut best_i = 0;
    for (i, y) in ys.iter().enumerate() {
        if *y > ys[best_i] {
            best_i = i;
        }
    }
    let (best, warm) = (ys[best_i], xs[best_i].clone());
    let Some(mut gp) = model::Gp::new(xs.clone(), &ys, cat.clone(), hyper.clone()) else {
        return tpe::suggest(spec, earlier, number);
    };
    let pending: Vec<Vec<f64>> = h
        .running
        .iter()
        .filter_map(|t| full_point(&dims, t))
        .collect();
    if !pending.is_empty() {
        let mut all_x = xs;
        let mut all_y = ys;
        for p in pending {
            all_y.push(gp.posterior(&p, None).0);
            all_x.push(p);
        }
        if let Some(believer) = model::Gp::new(all_x, &all_y, cat, hyper) {
            gp = believer;
        }
    }
    let u = acq::maximize(&Acq { gp: &gp, best }, &coords, &warm, &mut rng);
    dims::params_of(spec, &dims, &denormalize(&dims, &u))
}
