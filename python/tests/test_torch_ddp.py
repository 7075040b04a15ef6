"""dropcompute.torch with real PyTorch on the CPU and gloo, 2 and 4 processes under
`python -m torch.distributed.run` (issue 15, items 3a-3d)."""

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

import dropcompute

import launch  # python/tests/launch.py: the one worker launcher

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def torchrun(scenario: str, nproc: int, outdir: Path, **env_extra: str) -> List[Dict[str, Any]]:
    """Runs the DDP worker's ``scenario`` on ``nproc`` ranks; every rank's output."""
    return launch.torchrun("ddp_worker.py", scenario, outdir, nproc, **env_extra)


MODES = ["flat", "overlap"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nproc", [2, 4])
def test_threshold_off_equals_plain_ddp_accumulation(nproc: int, mode: str, tmp_path: Path) -> None:
    for r in torchrun("off", nproc, tmp_path, DC_MODE=mode):
        assert r["max_param_diff"] <= 1e-12, r
        assert r["moved"] > 1e-3, r  # the parameters did change
        # Python all-reduces per step: counts + one gradient buffer (flat); the counts alone in
        # overlap mode, where DDP's built-in all-reduce (C++, no hook of ours) reduced its one
        # bucket (the reducer's own count) and the parameters equal plain DDP's; the first step
        # also runs the one-time configuration check (``reduce.agree``)
        assert r["all_reduce_calls"] == ([2, 1, 1] if mode == "overlap" else [3, 2, 2]), r
        assert r["ddp_hook_calls"] == 0, r  # flat: DDP's own all-reduce never ran
        assert r["buckets"] == (1 if mode == "overlap" else 0), r


# Micro-batches computed per rank (M = 4): k in {0, 1, M}, different on different ranks.
K_CASES = ["0,1", "1,M", "M,0", "0,0,1,M", "M,1,0,M", "1,1,1,0"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ks", K_CASES)
def test_any_k_per_rank_gives_the_f64_mean_on_every_rank(ks: str, mode: str, tmp_path: Path) -> None:
    want = [4 if k == "M" else int(k) for k in ks.split(",")]
    res = torchrun("k", len(want), tmp_path, DC_KS=ks, DC_MODE=mode)
    for r in res:
        assert r["started"] == want, r
        assert r["counts"] == [4 * k for k in want], r
        assert r["divisor"] == float(4 * sum(want)), r
        assert r["grad_rel_err"] <= 1e-12, r
        assert r["same_everywhere"], r
        assert r["all_reduce_calls"] == (1 if mode == "overlap" else 2) and r["ddp_hook_calls"] == 0, r
        assert r["buckets"] == (1 if mode == "overlap" else 0), r


def test_every_rank_computing_nothing_skips_the_step_on_every_rank(tmp_path: Path) -> None:
    for r in torchrun("allidle", 2, tmp_path):
        assert r["counts"] == [0, 0] and r["skipped"] and r["divisor"] is None, r
        assert r["stepped"] is False and r["moved"] == 0.0 and r["grads_none"], r
    assert dropcompute.divisor(np.zeros(2, dtype=np.uint64)) is None


@pytest.mark.parametrize("mode", MODES)
def test_a_rank_computing_nothing_after_a_non_finite_micro_batch_joins_with_zeros(mode: str, tmp_path: Path) -> None:
    for r in torchrun("joininf", 2, tmp_path, DC_MODE=mode):
        assert r["first_finite"] is False, r  # the inf step itself is not finite
        assert r["started"] == [2, 0] and r["finite"] is True, r
        assert r["grad_rel_err"] <= 1e-12 and r["same_everywhere"], r


@pytest.mark.parametrize("mode", MODES)
def test_grad_scaler_backs_off_exactly_as_plain_ddp(mode: str, tmp_path: Path) -> None:
    for r in torchrun("scaler", 2, tmp_path, DC_MODE=mode):
        assert r["stepped"] == r["plain_stepped"] == [True, True, False, False, True, True], r
        assert r["scales"] == r["plain_scales"], r
        assert r["scales"][-1] == 2.0**18, r  # backed off twice
        assert r["lr"] == r["plain_lr"], r  # the scheduler stepped only with the optimizer
        assert r["max_param_diff"] <= 1e-6, r


def test_counts_are_exact_in_bf16_and_dtypes_keep_their_buffers(tmp_path: Path) -> None:
    for r in torchrun("dtypes", 2, tmp_path):
        assert r["counts"] == [257 + 1001] * 2 and r["divisor"] == 2516.0 == r["total"], r
        assert r["dtypes"] == ["torch.bfloat16", "torch.float32"], r
        assert r["f32_rel_err"] <= 1e-6, r  # float32 gradients never pass through bf16


def test_unused_parameters_keep_grad_none(tmp_path: Path) -> None:
    for r in torchrun("unused", 2, tmp_path):
        assert r["never_none"] == [True, True] and r["moved_never"] == 0.0, r
        assert r["rank0_has_grad"] == [True, True] and r["rank0_same"], r
        # Without find_unused_parameters: flat runs; overlap (forced or auto's choice) refuses
        # at the step that left DDP's reduction unfinished, naming the remedy, on every rank.
        nf = r["no_find"]
        assert nf["flat"] == ["flat", None], nf
        for mode in ["overlap", "auto"]:
            resolved, err = nf[mode]
            assert resolved == "overlap" and err is not None, nf
            assert f"rank {r['rank']}: step 0: model: DDP did not finish reducing" in err, nf
            assert "find_unused_parameters=True" in err and "mode='flat'" in err, nf


def test_mean_losses_uncounted_loss_vectors_and_differing_policies_are_refused(tmp_path: Path) -> None:
    for r in torchrun("refusals", 2, tmp_path):
        e = r["errors"]
        assert "returned a mean (NllLossBackward0)" in e["mean"], e
        assert "returned a mean (MeanBackward0)" in e["dot_mean"], e
        assert e["policy"] is not None and "different step configurations" in e["policy"], e
        b = r["per_token_counted"][2] // 2
        assert e["per_token"] is not None and f"returned {2 * b} per-sample losses for a micro-batch of {b} samples" \
            in e["per_token"] and "count_fn" in e["per_token"], e
        # With count_fn the same loss runs, counted as it says on both ranks.
        assert r["per_token_counted"] == [2 * b, 2 * 2 * b, 2 * b], r


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("field,nproc", [("step", 2), ("drop_guard", 2), ("assigner", 2), ("step", 3)])
def test_ranks_resumed_from_different_checkpoints_are_refused_on_every_rank(field: str, nproc: int, mode: str,
                                                                           tmp_path: Path) -> None:
    """The last rank restores a state whose step index, drop-guard counts or assigner differ
    from the others': the next step's count collective (every rank's state fingerprint in its own slot)
    raises ValueError on every rank, naming the ranks that differ from it."""
    for r in torchrun("resume_mismatch", nproc, tmp_path, DC_MODE=mode, DC_FIELD=field):
        assert r["raised"] is not None and "the ranks hold different step states" in r["raised"], r
        last = r["rank"] == nproc - 1
        other = list(range(nproc - 1)) if last else [nproc - 1]
        step = 1 + 3 if last and field == "step" else 1  # each rank's own step index
        assert f"rank {r['rank']}: step {step}: " in r["raised"] and f"rank(s) {other} differ" in r["raised"], r


@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_configured_differently_are_refused_before_any_collective_of_differing_length(
        nproc: int, tmp_path: Path) -> None:
    """Rank 0 differs from the others in what sets a collective's length (the mode ``auto``
    resolves to by bucket cap, a tracker, a retuner, a latency-learning step policy, the
    parameter count, the parameters' shapes) or only in the configuration (the sampler's seed,
    the retuner's replayed check): every rank raises ValueError at the first step, naming the ranks that differ (gloo aborted the
    process before the one-time check), and the next case runs in the same process group."""
    cases = ["auto_bucket_cap", "tracker", "retuner", "step_policy", "parameters", "parameter_shapes", "sampler_seed",
             "retuner_check"]
    for r in torchrun("split_config", nproc, tmp_path):
        other = [k for k in range(nproc) if k != 0] if r["rank"] == 0 else [0]
        for case in cases:
            e = r["errors"][case]
            assert e is not None and "the ranks run different step configurations" in e, (case, r)
            assert f"rank {r['rank']}: step 0: " in e and f"rank(s) {other} differ" in e, (case, r)


def test_the_configuration_check_is_no_compute_and_restored_steps_check_again(tmp_path: Path) -> None:
    """A rank 1 s late to the first step (300 ms threshold, no warm-up): nobody drops, since
    the wait in the one-time check is no compute; steps re-created on every rank from their
    ``state_dict`` check again and run the next step."""
    for r in torchrun("late_recreate", 2, tmp_path):
        assert r["first_started"] == [4, 4], r
        assert r["second_started"] == [4, 4] and r["second_step"] == 2, r


def test_a_fingerprint_equal_to_the_others_mean_is_still_refused(tmp_path: Path) -> None:
    """Fingerprints 1, 2, 3: rank 1's is the mean, which a summed check (3 x 2 == 1 + 2 + 3)
    accepts; compared slot by slot every rank refuses."""
    for r in torchrun("fingerprint_mean", 3, tmp_path):
        assert r["raised"] is not None and "the ranks run different step configurations" in r["raised"], r
        assert f"rank(s) {[k for k in range(3) if k != r['rank']]} differ" in r["raised"], r


def test_any_iterable_is_pulled_lazily(tmp_path: Path) -> None:
    for r in torchrun("iterable", 2, tmp_path):
        assert r["pulled"] == [0, 1, 2, 3] and r["same_as_list"], r
        assert r["counts"] == r["list_counts"] == [16, 16], r
        assert "micro_batches_per_step" in r["no_len_error"], r


@pytest.mark.parametrize("mode", MODES)
def test_sampler_computes_every_sample_once_per_epoch(mode: str, tmp_path: Path) -> None:
    res = torchrun("sampler", 2, tmp_path, DC_MODE=mode)
    assert res[0]["steps"] == res[1]["steps"], res  # every rank ends at the same step
    states = [json.loads(r["state"]) for r in res]
    assert states[0][0] == states[1][0], states  # the replicas agree (they differ only in their rank)
    assert [s[1] for s in states] == [0, 1], states
    assert res[1]["dropped"] > 0, res[1]  # the slowed rank dropped, its samples were dealt again
    seen: Dict[int, int] = {}
    for r in res:
        for _epoch, ids in r["computed"]:
            for i in ids:
                seen[i] = seen.get(i, 0) + 1
    assert sorted(seen) == list(range(96)), sorted(seen)
    assert set(seen.values()) == {2}, seen  # 2 epochs: each sample exactly twice


def test_static_graph_ddp_runs_flat_and_is_refused_in_overlap_mode(tmp_path: Path) -> None:
    for r in torchrun("static", 2, tmp_path / "flat", DC_MODE="flat"):
        assert r["steps"] == 3, r
    for r in torchrun("static", 2, tmp_path / "overlap", DC_MODE="overlap"):
        assert "model.static_graph: True" in r["refused"] and "mode='flat'" in r["refused"], r


# mode="auto": (case, what it resolves to: [mode, sync_lag] or the refusal's start).
HOOK_REFUSED = "refused: comm_hook: a DDP comm hook runs only in overlap mode, which cannot run here ("
AUTO = {
    "ddp_default": ["flat", 0],  # gradients (1560 bytes) below DDP's 25 MiB bucket cap
    "ddp_small_cap": ["overlap", 1],  # above a 1048-byte cap: overlap, with its sync lag
    "plain_module": ["flat", 0],  # no DDP reducer to overlap
    "static_graph_small_cap": ["flat", 0],  # DDP cannot accumulate under a static graph
    "sync_lag_0_small_cap": ["flat", 0],  # overlap needs the last micro-batch known in advance
    "tracker_small_cap": ["flat", 0],  # the tracker needs latencies overlap cannot measure
    "comm_hook": ["overlap", 1],  # the user's hook runs in DDP's reducer
    # A comm hook asks for overlap: where overlap cannot run, the refusal names comm_hook first.
    "comm_hook_static_graph": f"{HOOK_REFUSED}model.static_graph: True",
    "comm_hook_plain_module": f"{HOOK_REFUSED}model: mode='overlap' needs a DistributedDataParallel",
    "comm_hook_sync_lag_0": f"{HOOK_REFUSED}sync_lag: 0",
    "comm_hook_tracker": f"{HOOK_REFUSED}stragglers: 'StragglerTracker'",
    "comm_hook_flat": "refused: comm_hook: only mode='overlap' runs DDP's reducer",
    "flat_small_cap": ["flat", 0],  # an explicit mode is kept
    "overlap_default": ["overlap", 1],
}


def test_auto_mode_takes_overlap_only_where_it_can_run_and_the_gradients_exceed_a_bucket(tmp_path: Path) -> None:
    for r in torchrun("auto", 2, tmp_path):
        for case, want in AUTO.items():
            got = r["resolved"][case]
            if isinstance(want, str):
                assert isinstance(got, str) and got.startswith(want), (case, got)
                assert "comm_hook" not in case or "drop comm_hook" in got, (case, got)  # the remedy
            else:
                assert got == want, (case, got)
        # The resolved paths run: overlap through DDP's own reducer (one Python all-reduce a
        # step: the counts), flat through its own (two: the counts and the gradients), each
        # equal to plain DDP accumulation; the first step also checks the configurations.
        over, flat = r["runs"]["ddp_small_cap"], r["runs"]["ddp_default"]
        assert over["mode"] == "overlap" and over["all_reduce_calls"] == [2, 1, 1] and over["buckets"] >= 1, over
        assert flat["mode"] == "flat" and flat["all_reduce_calls"] == [3, 2, 2] and flat["buckets"] == 0, flat
        for run in (over, flat):
            assert run["max_param_diff"] <= 1e-12, run


def test_overlap_composes_with_the_users_comm_hook(tmp_path: Path) -> None:
    for r in torchrun("hook", 2, tmp_path):
        assert r["max_param_diff"] <= 1e-7, r  # plain DDP with the same bf16 compression hook
        assert r["buckets"] == 1, r  # DDP buckets in the last step


# (mode, the step rank 1 never joins, the collective rank 0 waits in there): at step 0 the
# one-time configuration check, the step's first collective; at step 1 of overlap mode DDP's
# bucket rebuild, run at the step's start; after it DDP's bucket all-reduce in the backward (the
# count collective is issued before it, asynchronously).
STALLS = [("flat", 0, "the configuration all-reduce"), ("overlap", 0, "the configuration all-reduce"),
          ("flat", 1, "the count all-reduce"), ("overlap", 1, "DDP's bucket rebuild (a broadcast)"),
          ("overlap", 2, "a DDP bucket's gradient all-reduce")]


@pytest.mark.parametrize("peer", ["stall", "die"])
@pytest.mark.parametrize("mode,stall,what", STALLS)
def test_a_peer_that_stalls_or_dies_is_a_typed_error_naming_the_collective(mode: str, stall: int, what: str,
                                                                          peer: str, tmp_path: Path) -> None:
    """A stalled peer is a TimeoutError after the process group's timeout; a peer that exits
    (its connections close) a CollectiveError (a RuntimeError) at once; both name the rank, the
    step and the collective, and chain the backend's error."""
    launch.run_workers("ddp_worker.py", ["timeout", str(tmp_path)], 2, timeout=300, DC_MODE=mode,
                       DC_STALL_AT=str(stall), DC_PEER=peer)
    r = json.loads((tmp_path / "rank0.json").read_text())
    assert r["context"] == [0, stall, what], r
    assert r["cause"] is not None, r  # the backend's own error, chained
    if peer == "stall":
        assert r["raised"] == "CollectiveTimeout" and "TimeoutError" in r["bases"], r
        assert r["message"].startswith(f"rank 0: step {stall}: {what} did not finish within the process group's "
                                       "timeout (5 s)"), r
        assert r["waited_s"] < 14.0, r  # the process group's 5 s timeout, not the peer's 15 s sleep
    else:
        assert r["raised"] == "CollectiveError" and "RuntimeError" in r["bases"], r
        assert r["message"].startswith(f"rank 0: step {stall}: {what} failed before the process group's timeout "
                                       "(a rank died, a connection broke, or the backend refused the call): "
                                       "RuntimeError: "), r
        assert r["waited_s"] < 4.5, r  # at once, not after the 5 s timeout


@pytest.mark.parametrize("mode,fail", [("flat", "backward"), ("overlap", "backward"), ("overlap", "hook")])
def test_an_error_of_the_backward_itself_is_not_called_a_collectives(mode: str, fail: str, tmp_path: Path) -> None:
    """The siblings the witness must tell apart: every rank alive, the last micro-batch's
    backward (in overlap mode the synced one, where DDP's all-reduce runs) raising its own
    RuntimeError, from an autograd function or from the user's comm hook after its all-reduce
    completed: the step re-raises it (DDP may add its own words around a hook's), on every rank,
    never as a collective's failure."""
    for r in torchrun("backward_error", 2, tmp_path, DC_MODE=mode, DC_FAIL=fail):
        assert r["raised"] == "RuntimeError" and "boom" in r["message"], r
        assert "rank died" not in r["message"], r


def dropcompute_bin() -> Path:
    p = Path(os.environ.get("DROPCOMPUTE_BIN", REPO / "target" / "debug" / "dropcompute"))
    if not p.exists():
        pytest.fail(f"{p} not built: run `cargo build --bin dropcompute` or set DROPCOMPUTE_BIN")
    return p


def test_controller_compute_log_loads_with_dropcompute_tune(tmp_path: Path) -> None:
    res = torchrun("log", 2, tmp_path)
    logs = [r["log"] for r in res]
    for path in logs:
        t = dropcompute.read_trace(path)
        assert t["latencies_ns"].shape == (1, 4, 12)
        assert (t["latencies_ns"] > 0).all()
        # The step overhead (the reduce, the optimizer, the loop) is derived from the recorded
        # clock starts, not assumed 0.
        assert (t["overhead_ns"] > 0).all(), t["overhead_ns"]
    p = subprocess.run([str(dropcompute_bin()), "tune", "--json", "--trace", *logs], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    cli = json.loads(p.stdout)
    assert len(cli) == 1, cli
    # Every rank's log in one call, as the CLI takes them: the CLI's verdict (its default check
    # is the predictive one), the threshold in whole ns.
    v = dropcompute.recommend(logs, check="predictive")
    verdict = cli[0]["verdict"]
    assert v.enabled == ("enable" in verdict), (v, verdict)
    if v.enabled:
        assert isinstance(v.threshold_ns, int) and v.threshold_ns == round(verdict["enable"]["threshold_ns"]), v
    else:
        assert v.threshold_ns is None, v
    with pytest.raises(ValueError, match="non-empty list"):
        dropcompute.recommend([])


def test_drop_guard_holds_the_run_within_its_bound_identically_on_every_rank(tmp_path: Path) -> None:
    """Rank 1 slowed past the deadline drops 2 of the step's 8 micro-batches (25 %) whenever the
    threshold is in force; the guard at 10 % holds it off on the steps its rule says, the same
    steps on both ranks, the run ends within the bound, and ``simulate`` of the run's own compute
    logs with the same policy replays the same decisions."""
    bound, n, m = 0.10, 2, 4
    res = torchrun("guard", n, tmp_path)
    r0, r1 = res
    assert r0["enforced"] == r1["enforced"] and r0["counts"] == r1["counts"], res
    enforced, started = r0["enforced"], r0["started"]
    assert not all(enforced) and enforced[0], enforced  # held off on some steps
    assert all(s == n * m for s, e in zip(started, enforced) if not e), (started, enforced)  # off: nothing dropped
    assert all(t is None for t, e in zip(r0["thresholds"], enforced) if not e), r0["thresholds"]
    # The guard's counts are the steps' own (handed: N·M per step; dropped: what did not start).
    handed, dropped, reserve = r0["counts"]
    assert handed == n * m * len(started) and dropped == sum(n * m - s for s in started), (r0["counts"], started)
    assert reserve == max(n * m - s for s, e in zip(started, enforced) if e), r0["counts"]
    assert dropped / handed <= bound, r0["counts"]
    # The rule, recomputed here from the steps' counts (independently of the binding).
    h, d, rsv = 0, 0, 0
    for s, e in zip(started, enforced):
        assert e == (d + rsv <= bound * (h + n * m)), (h, d, rsv, s, e)
        h, d = h + n * m, d + n * m - s
        if e:
            rsv = max(rsv, n * m - s)
    assert r0["state"][:3] == r0["counts"], r0["state"]
    # state_dict restores the counts into a new step; states no run writes are refused by name.
    assert r0["restored"] == r0["counts"], r0
    ref = r0["refusals"]
    assert ref["inconsistent"] is not None and "state['drop_guard']" in ref["inconsistent"] and \
        "handed 1, dropped 2, reserve 0" in ref["inconsistent"], ref
    assert ref["short"] is not None and "must be 4 ints" in ref["short"], ref
    assert ref["negative"] is not None and "state['drop_guard'][1]: -1: must be an int" in ref["negative"], ref
    # The prediction replays the guard on the run's own logs: the same decisions and starts.
    logs = [r["log"] for r in res]
    sim = dropcompute.simulate(logs, dropcompute.Policy(50_000_000, "before", warmup_steps=0, min_micro_batches=1,
                                                        drop_guard=bound))
    assert list(sim["enforced_per_step"]) == enforced, (sim["enforced_per_step"], enforced)
    assert [int(x) for x in sim["started_per_step"]] == started, (sim["started_per_step"], started)
    assert sim["drop_rate"] <= bound, sim["drop_rate"]
