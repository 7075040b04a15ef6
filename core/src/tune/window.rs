//! The jitter window of a threshold search ([`super::Guardrails::jitter_ns`]): which thresholds
//! judge a candidate. Both searches use it, DropCompute's ([`super::recommend`]) and each step
//! policy's ([`super::policies::best_threshold_on`]).
//!
//! Owns: the candidate set under a jitter ([`candidates`]) and each candidate's window
//! ([`judge`]). Must not touch: scoring or the guardrails' verdict (the caller replays each
//! threshold and decides), I/O, clocks.
#![forbid(unsafe_code)]

/// `grid` (thresholds in ns, > 0) with each point less `jitter_ns` added when `jitter_ns` > 0
/// (and the difference > 0), sorted ascending and deduplicated; `grid` as given when
/// `jitter_ns` is 0. Why: a search's grid holds the curve's breakpoints (micro-batch ends),
/// whose window always reaches past them; a breakpoint less the jitter is the largest
/// threshold whose window stays below it.
pub fn candidates(grid: &[f64], jitter_ns: f64) -> Vec<f64> {
    let mut c = grid.to_vec();
    if jitter_ns > 0.0 {
        c.extend(grid.iter().map(|t| t - jitter_ns).filter(|t| *t > 0.0));
        c.sort_by(f64::total_cmp);
        c.dedup();
    }
    c
}

/// The window of threshold `t` (ns) among `grid`: the indices of `grid`'s points within
/// +-`jitter_ns` of `t` (`t` itself left out) and the window's two ends, t - jitter (1 ns at
/// least) and t + jitter; no points and no ends when `jitter_ns` is 0. The one definition
/// [`judge`] and a search that replays one point at a time (`super::policies::compare`) use.
pub fn window_of(t: f64, grid: &[f64], jitter_ns: f64) -> (Vec<usize>, Option<[f64; 2]>) {
    if jitter_ns <= 0.0 {
        return (Vec::new(), None);
    }
    let near = grid.iter().enumerate().filter(|(_, c)| **c != t && (**c - t).abs() <= jitter_ns).map(|(i, _)| i);
    (near.collect(), Some([(t - jitter_ns).max(1.0), t + jitter_ns]))
}

/// Each of `cands` (ns) with its own score and its window's scores: `score(t)` is called once
/// per candidate and twice more per candidate when `jitter_ns` > 0, for the window's ends
/// ([`window_of`]). The window of t holds t's own score first, then every candidate within
/// +-`jitter_ns` of it, then the two ends; with `jitter_ns` = 0 it holds t's own score only.
/// Returned in `cands`' order as (own score, window).
pub fn judge<S: Clone>(cands: &[f64], jitter_ns: f64, score: &mut dyn FnMut(f64) -> S) -> Vec<(S, Vec<S>)> {
    let own: Vec<S> = cands.iter().map(|&t| score(t)).collect();
    cands
        .iter()
        .zip(&own)
        .map(|(&t, s)| {
            let (near, ends) = window_of(t, cands, jitter_ns);
            let mut window = vec![s.clone()];
            window.extend(near.into_iter().map(|i| own[i].clone()));
            window.extend(ends.into_iter().flatten().map(&mut *score));
            (s.clone(), window)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_add_each_point_less_the_jitter_and_keep_the_grid_without_one() {
        assert_eq!(candidates(&[3.0, 1.0, 5.0], 0.0), vec![3.0, 1.0, 5.0]);
        // 1 - 2 <= 0 is left out; 5 - 2 = 3 is already there.
        assert_eq!(candidates(&[1.0, 3.0, 5.0], 2.0), vec![1.0, 3.0, 5.0]);
        assert_eq!(candidates(&[1.0, 3.0, 5.5], 0.5), vec![0.5, 1.0, 2.5, 3.0, 5.0, 5.5]);
    }

    #[test]
    fn a_window_holds_its_own_score_its_neighbours_and_its_two_ends() {
        let mut asked = Vec::new();
        let judged = judge(&[1.0, 2.0, 4.0], 1.5, &mut |t| {
            asked.push(t);
            t * 10.0
        });
        // Own scores first (one call each), then per candidate its two ends (the lower at 1 ns).
        assert_eq!(asked, vec![1.0, 2.0, 4.0, 1.0, 2.5, 1.0, 3.5, 2.5, 5.5]);
        assert_eq!(judged[0], (10.0, vec![10.0, 20.0, 10.0, 25.0]));
        assert_eq!(judged[1], (20.0, vec![20.0, 10.0, 10.0, 35.0]));
        assert_eq!(judged[2], (40.0, vec![40.0, 25.0, 55.0]));
        // No jitter: each window is its own score.
        assert_eq!(judge(&[1.0, 2.0], 0.0, &mut |t| t), vec![(1.0, vec![1.0]), (2.0, vec![2.0])]);
    }
}
