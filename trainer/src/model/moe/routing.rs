//! The integer side of MoE routing: which token goes to which expert, decided on the host from
//! the router probabilities (top-k, then expert capacity).

/// The integer side of routing, computed on the host from the router probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutePlan {
    /// (N·k) chosen experts, token-major, best first.
    pub choices: Vec<u32>,
    /// Kept assignments grouped by expert: the token of each...
    pub tokens: Vec<u32>,
    /// ...and its flat index t·k + j into the (N, k) gate matrix.
    pub slots: Vec<u32>,
    /// Kept assignments per expert (lengths of the groups above).
    pub kept: Vec<usize>,
    /// Assignments per expert before capacity.
    pub routed: Vec<usize>,
    pub dropped: usize,
}

/// Top-k per token (ties to the lower expert index), then capacity in GShard priority order:
/// every token's first choice is placed before any second choice, tokens in order.
pub fn route(
    probs: &[f32],
    n: usize,
    experts: usize,
    k: usize,
    capacity: Option<usize>,
) -> RoutePlan {
    let mut choices = Vec::with_capacity(n * k);
    let mut order: Vec<usize> = (0..experts).collect();
    for t in 0..n {
        let row = &probs[t * experts..(t + 1) * experts];
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        choices.extend(order[..k].iter().map(|&e| e as u32));
    }
    let mut groups: Vec<Vec<(u32, u32)>> = vec![Vec::new(); experts];
    let mut routed = vec![0usize; experts];
    let mut dropped = 0;
    for j in 0..k {
        for t in 0..n {
            let slot = t * k + j;
            let e = choices[slot] as usize;
            routed[e] += 1;
            if capacity.is_none_or(|c| groups[e].len() < c) {
                groups[e].push((t as u32, slot as u32));
            } else {
                dropped += 1;
            }
        }
    }
    let kept = groups.iter().map(Vec::len).collect();
    let (tokens, slots) = groups.into_iter().flatten().unzip();
    RoutePlan {
        choices,
        tokens,
        slots,
        kept,
        routed,
        dropped,
    }
}
