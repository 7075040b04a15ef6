//! The step policies in Python: `StepPolicy` (`policy::StepPolicy`: the kind and its
//! parameters), `Assigner` (`policy::assign::Assigner`: each rank's micro-batch count of the
//! next step) and `backup_aggregated` (`policy::backup_aggregated`).
//!
//! Owns: argument conversion and the mapping of the crate's validation to `ValueError`
//! (the kind by its serde name, the tail shape by `TailShape::checked`, the check mode by
//! `Policy::resolve_check`). Must not touch: the rules themselves (every method forwards to the
//! crate: `StepPolicy::deadline`, `Policy::check_mode`, `StepPolicy::budget_cap`,
//! `Assigner::new`/`observe`, `backup_aggregated`), which `train` and `simulate` run too.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use dropcompute::policy::assign::Assigner as RsAssigner;
use dropcompute::policy::{self, DeadlineConfig, Threshold};

use crate::{Policy, value_err};

/// The constructor's arguments, in `__reduce__`'s order.
type StepPolicyArgs = (&'static str, u32, Option<u64>, Option<u32>, f64, u32, u32, Option<f64>);
/// [`StepPolicyArgs`] as `_restore` reads them back.
type OwnedStepPolicyArgs = (String, u32, Option<u64>, Option<u32>, f64, u32, u32, Option<f64>);

/// A step policy with its parameters (`policy::StepPolicy`). See `dropcompute/_core.pyi`.
#[pyclass(module = "dropcompute._core", frozen)]
#[derive(Clone)]
pub struct StepPolicy {
    pub(crate) inner: policy::StepPolicy,
}

fn parse_kind(kind: &str) -> PyResult<policy::Policy> {
    policy::Policy::ALL.into_iter().find(|p| p.name() == kind).ok_or_else(|| {
        let names: Vec<&str> = policy::Policy::ALL.iter().map(|p| p.name()).collect();
        value_err("kind", format!("{kind:?}: must be one of {}", names.join(", ")))
    })
}

impl StepPolicy {
    fn args(&self) -> StepPolicyArgs {
        let p = &self.inner;
        (
            p.policy.name(),
            p.backup_workers,
            p.budget.as_ns(),
            p.budget_max_micro_batches,
            p.rebalance.hysteresis,
            p.rebalance.min_micro_batches,
            p.tail.split,
            p.tail.cost,
        )
    }
}

#[pymethods]
impl StepPolicy {
    #[new]
    #[pyo3(signature = (kind, *, backup_workers=1, budget_ns=None, budget_max_micro_batches=None, rebalance_hysteresis=0.05, rebalance_min_micro_batches=1, tail_split=1, tail_cost=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        kind: &str,
        #[pyo3(from_py_with = crate::args::number)] backup_workers: u32,
        #[pyo3(from_py_with = crate::args::opt_number)] budget_ns: Option<u64>,
        #[pyo3(from_py_with = crate::args::opt_number)] budget_max_micro_batches: Option<u32>,
        #[pyo3(from_py_with = crate::args::number)] rebalance_hysteresis: f64,
        #[pyo3(from_py_with = crate::args::number)] rebalance_min_micro_batches: u32,
        #[pyo3(from_py_with = crate::args::number)] tail_split: u32,
        #[pyo3(from_py_with = crate::args::opt_number)] tail_cost: Option<f64>,
    ) -> PyResult<Self> {
        let policy = parse_kind(kind)?;
        if budget_ns == Some(0) {
            return Err(value_err("budget_ns", "0: must be >= 1 (None: no budget)"));
        }
        if !rebalance_hysteresis.is_finite() || rebalance_hysteresis < 0.0 {
            return Err(value_err("rebalance_hysteresis", format!("{rebalance_hysteresis}: must be finite and >= 0")));
        }
        let tail = policy::TailShape::checked(tail_split, tail_cost, None)
            .map_err(|e| value_err(if e.field == "split" { "tail_split" } else { "tail_cost" }, &e))?;
        let inner = policy::StepPolicy {
            policy,
            backup_workers,
            budget: Threshold::from_ns(budget_ns),
            budget_max_micro_batches,
            rebalance: policy::RebalanceConfig {
                hysteresis: rebalance_hysteresis,
                min_micro_batches: rebalance_min_micro_batches,
            },
            tail,
            // No padded length prior from Python (cost-balance's step 0 dealt blind).
            bucket_tokens: policy::BucketTokens::default(),
        };
        Ok(Self { inner })
    }

    /// The policy's name (`synchronous`, `drop-before`, ...).
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.policy.name()
    }
    #[getter]
    fn backup_workers(&self) -> u32 {
        self.inner.backup_workers
    }
    #[getter]
    fn budget_ns(&self) -> Option<u64> {
        self.inner.budget.as_ns()
    }
    #[getter]
    fn budget_max_micro_batches(&self) -> Option<u32> {
        self.inner.budget_max_micro_batches
    }
    #[getter]
    fn rebalance_hysteresis(&self) -> f64 {
        self.inner.rebalance.hysteresis
    }
    #[getter]
    fn rebalance_min_micro_batches(&self) -> u32 {
        self.inner.rebalance.min_micro_batches
    }
    #[getter]
    fn tail_split(&self) -> u32 {
        self.inner.tail.split
    }
    #[getter]
    fn tail_cost(&self) -> Option<f64> {
        self.inner.tail.cost
    }
    /// Whether the DropCompute threshold applies (`Policy::drops`).
    #[getter]
    fn drops(&self) -> bool {
        self.inner.policy.drops()
    }
    /// Whether the assignment learns from the per-rank latencies (backup workers, rebalancing).
    #[getter]
    fn learns(&self) -> bool {
        matches!(
            self.inner.policy,
            policy::Policy::BackupWorkers | policy::Policy::Rebalance | policy::Policy::RebalanceDrop
        )
    }
    /// Micro-batches per rank the assigner may hand out for a nominal `micro_batches` (M):
    /// `StepPolicy::budget_cap` (2·M unless `budget_max_micro_batches`), at least M.
    fn slots(&self, #[pyo3(from_py_with = crate::args::number)] micro_batches: u32) -> u32 {
        self.inner.budget_cap(micro_batches).max(micro_batches)
    }

    /// The deadline configuration the walk runs under, from the job's `policy`: its check mode
    /// becomes the step policy's (`Policy::resolve_check`: drop-before runs the before check,
    /// drop-predictive the predictive one; a contradicting `policy.check` is refused), its
    /// threshold `StepPolicy::deadline` (the budget for compute-budget, off for the policies
    /// without a deadline). Raises ValueError for a contradicting check, and for compute-budget
    /// without `budget_ns` (as `train` refuses it).
    fn deadline(&self, policy: &Policy) -> PyResult<Policy> {
        let cfg = policy.cfg;
        let p = self.inner.policy;
        let check = p.resolve_check(Some(cfg.check), cfg.check).map_err(|runs| {
            value_err(
                "policy.check",
                format!("{:?}: step policy {} runs the {:?} check", cfg.check.name(), p.name(), runs.name()),
            )
        })?;
        if p == policy::Policy::ComputeBudget && self.inner.budget == Threshold::Off {
            return Err(value_err("budget_ns", "None: compute-budget needs a budget (ns)"));
        }
        Ok(Policy {
            cfg: DeadlineConfig { threshold: self.inner.deadline(cfg.threshold), check, ..cfg },
            kind: policy.kind,
            bucket_lengths: policy.bucket_lengths.clone(),
            drop_guard: policy.drop_guard,
        })
    }

    /// The parameters as the crate's JSON (`policy::StepPolicy`; the budget in ms).
    fn to_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.inner).map_err(|e| value_err("StepPolicy", e))
    }

    fn __reduce__(slf: &Bound<'_, Self>) -> PyResult<(Py<PyAny>, (StepPolicyArgs,))> {
        let restore = slf.get_type().getattr("_restore")?.unbind();
        Ok((restore, (slf.get().args(),)))
    }

    /// `__reduce__`'s constructor (validated again).
    #[staticmethod]
    fn _restore(a: OwnedStepPolicyArgs) -> PyResult<Self> {
        Self::new(&a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<StepPolicy>().is_ok_and(|o| o.get().inner == self.inner)
    }
    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.__repr__().hash(&mut h);
        h.finish()
    }
    fn __repr__(&self) -> String {
        let (kind, b, budget, cap, hyst, rbmin, split, cost) = self.args();
        let opt = |v: Option<String>| v.unwrap_or_else(|| "None".into());
        format!(
            "StepPolicy({kind:?}, backup_workers={b}, budget_ns={}, budget_max_micro_batches={}, \
             rebalance_hysteresis={hyst:?}, rebalance_min_micro_batches={rbmin}, tail_split={split}, tail_cost={})",
            opt(budget.map(|x| x.to_string())),
            opt(cap.map(|x| x.to_string())),
            opt(cost.map(|x| format!("{x:?}")))
        )
    }
}

/// Each rank's micro-batch count of the next step (`policy::assign::Assigner`, the scheduler's
/// and the simulator's). Every rank holds a replica fed the same gathered latencies, so all
/// agree without communicating. See `dropcompute/_core.pyi`.
#[pyclass(module = "dropcompute._core")]
pub struct Assigner {
    inner: RsAssigner,
    world_size: usize,
}

#[pymethods]
impl Assigner {
    #[new]
    #[pyo3(signature = (step_policy, world_size, micro_batches, *, warmup_steps=3, first_step=0))]
    fn new(
        step_policy: &StepPolicy,
        #[pyo3(from_py_with = crate::args::number)] world_size: usize,
        #[pyo3(from_py_with = crate::args::number)] micro_batches: u32,
        #[pyo3(from_py_with = crate::args::number)] warmup_steps: u64,
        #[pyo3(from_py_with = crate::args::number)] first_step: u64,
    ) -> PyResult<Self> {
        if world_size == 0 {
            return Err(value_err("world_size", "0: must be >= 1"));
        }
        let world_size = crate::world_size("world_size", world_size)?;
        if micro_batches == 0 {
            return Err(value_err("micro_batches", "0: must be >= 1"));
        }
        crate::micro_batches("micro_batches", micro_batches as usize)?;
        let p = step_policy.inner;
        // The simulator's slots (`sim::policies`): the budget's cap in parts, at least M·S.
        let slots = p.budget_cap(micro_batches).saturating_mul(p.tail.parts());
        crate::micro_batches("slots", slots as usize)?;
        // The deadline the assignment depends on: the compute budget (others ignore it).
        let threshold = p.deadline(Threshold::Off);
        let inner = RsAssigner::new(p, world_size, micro_batches, slots, warmup_steps, threshold, first_step);
        Ok(Self { inner, world_size })
    }

    /// Micro-batches (parts, with a tail shape) per rank for the next step, one per rank.
    fn assignment(&self) -> Vec<u32> {
        self.inner.assignment().to_vec()
    }

    /// Feeds step `step`'s per-rank mean latency per whole micro-batch (ns, one per rank; NaN
    /// for a rank that computed nothing) and moves to step `step + 1`'s assignment. Returns
    /// True when a rebalanced assignment needed more than the slots (the previous one stays).
    fn observe(
        &mut self,
        #[pyo3(from_py_with = crate::args::number)] step: u64,
        #[pyo3(from_py_with = crate::args::vec_number)] per_rank_micro_batch_ns: Vec<f64>,
    ) -> PyResult<bool> {
        if per_rank_micro_batch_ns.len() != self.world_size {
            return Err(value_err(
                "per_rank_micro_batch_ns",
                format!("{} entries: must have one per rank ({})", per_rank_micro_batch_ns.len(), self.world_size),
            ));
        }
        Ok(self.inner.observe(step, &per_rank_micro_batch_ns))
    }

    /// The step policy.
    #[getter]
    fn step_policy(&self) -> StepPolicy {
        StepPolicy { inner: *self.inner.params() }
    }

    /// The replica's state as JSON (for a checkpoint; `Assigner.from_state` reads it back).
    fn state(&self) -> PyResult<String> {
        serde_json::to_string(&(&self.inner, self.world_size)).map_err(|e| value_err("state", e))
    }

    /// Why `restored` (e.g. `from_state` of a checkpoint) cannot replace this replica: the
    /// first configuration field that differs or an assignment above the slots
    /// (`Assigner::restore_conflict`); None when it can.
    fn restore_conflict(&self, restored: PyRef<'_, Assigner>) -> Option<String> {
        self.inner.restore_conflict(&restored.inner)
    }

    /// A replica from `state` (what `state` returned).
    #[staticmethod]
    fn from_state(state: &str) -> PyResult<Self> {
        let (inner, world_size): (RsAssigner, usize) =
            serde_json::from_str(state).map_err(|e| value_err("state", format!("not an Assigner state: {e}")))?;
        if inner.assignment().len() != world_size {
            return Err(PyValueError::new_err("state: the assignment's length is not world_size"));
        }
        Ok(Self { inner, world_size })
    }
}

/// Backup workers' aggregation (`policy::backup_aggregated`): per rank whether its gradient
/// enters the step, given each rank's compute finish time (ns) and b: the first N - min(b, N-1)
/// to finish (ties: lower rank first; NaN latest).
#[pyfunction]
pub fn backup_aggregated(
    #[pyo3(from_py_with = crate::args::vec_number)] finish_ns: Vec<f64>,
    #[pyo3(from_py_with = crate::args::number)] b: u32,
) -> Vec<bool> {
    policy::backup_aggregated(&finish_ns, b)
}
