"""Are the verdicts calibrated? Coverage of the 95% interval and false claims on A/A, power on A/B.

(a) Simulated A/A. Each trial draws a device: within-session CV 1-5%, AR(1) iterations
    (rho 0-0.7), between-session sigma 1-8% (log-uniform), a slow random-walk drift of the
    device level from session to session, a within-session warm-up trend (0-2%), outliers
    (0-3% of iterations, +Exp(50%)); a third of the devices have two states (sessions switch
    into a 10-35% faster or slower state with p 5-25% per session and stay there a while, as
    the real runs on this host do). It learns the device's noise model from K earlier A/A pairs
    (consecutive sessions), then runs a fresh A/A experiment with 1 or 3 sessions per arm
    (interleaved A B, or A B B A A B). Methods:
      old iter      stats.bootstrap_ratio over iterations (pooled for 3 sessions), claim when the
                    95% interval excludes 1 (an interval that sees iterations only)
      old 2-level   stats.bootstrap_ratio resampling sessions then iterations (no noise model)
      new default   analysis.verdict with no noise model (the default prior)
      new learned   analysis.verdict with the noise model learned from K A/A pairs
    coverage = interval holds 1.0; false claim = verdict speedup or slowdown.
    Power: the same with a true 10% difference (candidate 1.10x faster) at CV 1-3%, by
    sigma_between band: detection = verdict "speedup".
(b) Real A/A on this machine: the local runner runs the same model R times in a row (N timed
    iterations each, fresh process each time, as the farm's local driver would); ETDumps
    parsed with sme2farm.analysis. Consecutive runs are paired; the noise model is learned on
    the first half, coverage and false claims measured on the second half (pairs for 1 session
    per arm; A B B A A B blocks of six for 3 sessions per arm).

(c) Real A/A through the farm (--farm R): `sme2-farm up` on this host (embedded default), then,
    as a user would, R experiments of one model against itself (`submit A.pte --vs A.pte`: the
    kind-"model" verdict inside one experiment) and R pairs of separate experiments of that model
    compared with GET /comparisons (`sme2-client compare`), then one clearly different pair
    (cnn_blocks 2 vs 50 blocks) that must be told apart. The device's noise model starts from the
    default prior and learns from the farm's own identical work as it goes, as in production.
    Prints the claims (speedup or slowdown) out of R for each; the issue's goal is <= 2 in 10.

    .venv/bin/python bench/calibration.py [--trials 300] [--real-runs 120] [--no-real] [--farm 10]
    (defaults run in ~2 min on this 2-core host; --trials 2000 --real-runs 400 for tighter figures)
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from sme2farm.analysis import analyze
from sme2farm.analysis.stats import bootstrap_ratio
from sme2farm.analysis.noise import NoiseModel
from sme2farm.analysis.sessions import summarize
from sme2farm.analysis.verdict import plan_sessions, verdict

ROOT = Path(__file__).resolve().parent.parent
OLD_BOOT = 500      # the old method's resamples (10,000 in compare(); its coverage barely moves at 500)
NEW_BOOT = 500      # within-session bootstrap per session (2,000 in verdict(); 500 keeps the bench short)


# --- simulation ----------------------------------------------------------------------------

def draw_device(rng: np.random.Generator, cv: tuple[float, float] = (0.01, 0.05),
                sigma: tuple[float, float] = (0.01, 0.08), bimodal: bool = True) -> dict:
    sb = math.exp(rng.uniform(math.log(sigma[0]), math.log(sigma[1])))
    bimodal = bimodal and rng.random() < 1 / 3
    return {"cv": rng.uniform(*cv), "rho": rng.uniform(0.0, 0.7), "sigma_b": sb,
            "drift": rng.uniform(0.0, 0.3) * sb, "trend": rng.uniform(0.0, 0.02), "p_out": rng.uniform(0.0, 0.03),
            # a second device state (another core, another frequency) that sessions switch into
            # and stay in for a while, as the real A/A runs on this host do (medians ~66 vs ~93 us)
            "p_switch": rng.uniform(0.05, 0.25) if bimodal else 0.0,
            "shift": rng.choice([-1, 1]) * rng.uniform(0.10, 0.35) if bimodal else 0.0}


def simulate(rng: np.random.Generator, dev: dict, n_sessions: int, n: int, base_ms: float = 1.0) -> np.ndarray:
    """(n_sessions, n) latencies of consecutive sessions of one device."""
    level = np.cumsum(rng.normal(0.0, dev["drift"], n_sessions)) + rng.normal(0.0, dev["sigma_b"], n_sessions)
    if dev["p_switch"]:
        flips = rng.random(n_sessions) < dev["p_switch"]
        state = (np.cumsum(flips) + rng.integers(0, 2)) % 2
        level = level + dev["shift"] * state
    rho, cv = dev["rho"], dev["cv"]
    e = np.empty((n_sessions, n))
    e[:, 0] = rng.normal(0.0, cv, n_sessions)
    innov = rng.normal(0.0, cv * math.sqrt(1 - rho * rho), (n_sessions, n))
    for i in range(1, n):
        e[:, i] = rho * e[:, i - 1] + innov[:, i]
    trend = rng.uniform(0.0, dev["trend"], n_sessions)[:, None] * np.linspace(0.0, 1.0, n)[None, :]
    x = base_ms * np.exp(level[:, None] + e + trend)
    out = rng.random((n_sessions, n)) < dev["p_out"]
    x[out] *= 1.0 + rng.exponential(0.5, int(out.sum()))
    return x


def arms(x, k: int) -> tuple[list, list]:
    """Interleave 2k consecutive sessions A B B A A B ... into (A sessions, B sessions)."""
    pattern = ("A", "B", "B", "A") * k
    a = [x[i] for i in range(2 * k) if pattern[i] == "A"]
    b = [x[i] for i in range(2 * k) if pattern[i] == "B"]
    return a, b


def old_claims(a: list, b: list, seed: int, two_level: bool) -> tuple[bool, bool, bool]:
    """(covers 1, claims speedup, claims anything) for the old bootstrap."""
    fa, fb = np.concatenate(a), np.concatenate(b)
    kw = {"base_sessions": a, "cand_sessions": b} if two_level else {}
    r = bootstrap_ratio(fa, fb, n_boot=OLD_BOOT, seed=seed, **kw)
    lo, hi = r["ci_low"], r["ci_high"]
    return lo <= 1.0 <= hi, lo > 1.0, lo > 1.0 or hi < 1.0


def new_claims(a: list, b: list, noise, seed: int) -> tuple[bool, bool, bool, str]:
    v = verdict(a, b, noise=noise, seed=seed, n_boot=NEW_BOOT)
    return v.ci_low <= 1.0 <= v.ci_high, v.verdict == "speedup", v.significant, v.verdict


METHODS = ("old iter", "old 2-level", "new default", "new learned")


def claims_by_method(a: list, b: list, sa, sb, model, seed: int, k: int) -> dict:
    """Every method's (covers 1, claims speedup, claims anything, verdict or None) on one A/A
    experiment (a, b: its arms' sessions; sa, sb: them summarised; model: the learned noise model).
    The old two-level bootstrap needs >= 2 sessions per arm and is left out below that."""
    out = {}
    for m in METHODS:
        if m.startswith("old"):
            if m == "old 2-level" and k < 2:
                continue
            out[m] = (*old_claims(a, b, seed, two_level=(m == "old 2-level")), None)
        else:
            out[m] = new_claims(sa, sb, model if m == "new learned" else None, seed)
    return out


def run_sim(trials: int, k: int, n: int, k_prior: int, true_ratio: float, seed: int,
            cv: tuple[float, float], sigma: tuple[float, float], bimodal: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    res = {m: {"cover": [], "speedup": [], "claim": []} for m in METHODS}
    res["sigma_b"] = []
    res["bimodal"] = []
    res["learned_sigma"] = []
    res["verdicts"] = {}
    for t in range(trials):
        dev = draw_device(rng, cv, sigma, bimodal)
        res["bimodal"].append(dev["p_switch"] > 0)
        hist = simulate(rng, dev, 2 * k_prior + 2 * k, n)
        prior = hist[: 2 * k_prior]
        model = NoiseModel.from_sessions([prior[2 * i: 2 * i + 2] for i in range(k_prior)], n_boot=200, seed=t)
        a, b = arms(hist[2 * k_prior:], k)
        b = [s / true_ratio for s in b]
        res["sigma_b"].append(dev["sigma_b"])
        res["learned_sigma"].append(model.sigma_between)
        sa, sb = summarize(a, n_boot=NEW_BOOT, seed=t), summarize(b, n_boot=NEW_BOOT, seed=t + 1)
        for m, (c, s, cl, v) in claims_by_method(a, b, sa, sb, model, t, k).items():
            if m == "new learned":
                res["verdicts"][v] = res["verdicts"].get(v, 0) + 1
            res[m]["cover"].append(c)
            res[m]["speedup"].append(s)
            res[m]["claim"].append(cl)
    return res


def pct(x) -> str:
    return f"{100 * float(np.mean(x)):5.1f}%" if len(x) else "    —"


def bench_sim(args) -> dict:
    out = {}
    print(f"(a) simulated A/A: {args.trials} trials per row, {args.n} iterations per session, noise model "
          f"learned from K={args.k_prior} prior A/A pairs; devices: CV 1-5%, AR(1) rho 0-0.7, "
          "sigma_between 1-8% log-uniform, random-walk drift, warm-up trend 0-2%, outliers 0-3%; a third of them "
          "two-state (sessions switch into a 10-35% faster/slower state, p 5-25% per session, and stay)")
    print(f"  {'sessions/arm':<13}{'method':<14}{'coverage':>9}{'false claims':>14}   "
          f"coverage, one-state devices by sigma_between 1-2% | 2-4% | 4-8% | two-state devices")
    for k in (1, 3):
        t0 = time.monotonic()
        r = run_sim(args.trials, k, args.n, args.k_prior, 1.0, args.seed + k, (0.01, 0.05), (0.01, 0.08))
        sb = np.array(r["sigma_b"])
        bi = np.array(r["bimodal"])
        bands = [(sb < 0.02) & ~bi, (sb >= 0.02) & (sb < 0.04) & ~bi, (sb >= 0.04) & ~bi, bi]
        for m in METHODS:
            if not r[m]["cover"]:
                continue
            cov = np.array(r[m]["cover"])
            by = " | ".join(pct(cov[bd]) for bd in bands)
            print(f"  {k:<13}{m:<14}{pct(cov):>9}{pct(r[m]['claim']):>14}   {by}")
            out[(k, m)] = (float(np.mean(cov)), float(np.mean(r[m]["claim"])))
        ls = np.array(r["learned_sigma"])[~bi]
        print(f"  {'':<13}(one-state devices: learned sigma / true median {np.median(ls / sb[~bi]):.2f}, "
              f"IQR {np.percentile(ls / sb[~bi], 25):.2f}-{np.percentile(ls / sb[~bi], 75):.2f}; new learned verdicts "
              f"{r['verdicts']}; {time.monotonic() - t0:.0f} s)")
    print(f"\n  power: true 10% difference (candidate 1.10x faster), CV 1-3%, {args.power_trials} trials per row; "
          "one-state devices; detection = verdict speedup (old: interval above 1)")
    print(f"  {'sessions/arm':<13}{'sigma_between':<15}" + "".join(f"{m:>14}" for m in METHODS))
    for k in (1, 3):
        for lo, hi in ((0.01, 0.02), (0.02, 0.04), (0.04, 0.08)):
            r = run_sim(args.power_trials, k, args.n, args.k_prior, 1.10, args.seed + 100 + k, (0.01, 0.03), (lo, hi),
                        bimodal=False)
            row = "".join(f"{(pct(r[m]['speedup']) if r[m]['speedup'] else '—'):>14}" for m in METHODS)
            print(f"  {k:<13}{f'{100 * lo:.0f}-{100 * hi:.0f}%':<15}{row}")
            for m in METHODS:
                if r[m]["speedup"]:
                    out[("power", k, lo, m)] = float(np.mean(r[m]["speedup"]))
    return out


# --- real A/A ------------------------------------------------------------------------------

def model_path(name: str, blocks: int | None) -> Path:
    """The example exported once and cached (exporting costs ~20-80 s of torch on this host)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sme2farm-bench"
    out = cache / (f"{name}{blocks or ''}.pte")
    if not out.exists():
        from sme2farm.runners.examples import export_example

        kw = {"blocks": blocks} if blocks else {}
        export_example(name, out.with_suffix(".tmp.pte"), **kw).rename(out)
    return out


def real_runs(runs: int, iterations: int, warmup: int, model: Path, threads: int) -> list[np.ndarray]:
    from sme2farm.runners.build import build_local

    build = build_local()
    binary = (ROOT / "runners" / "build" / build.path) if not Path(build.path).is_absolute() else Path(build.path)
    sessions = []
    with tempfile.TemporaryDirectory(prefix="sme2-cal-") as d:
        for i in range(runs):
            et = Path(d) / f"r{i}.etdp"
            argv = [str(binary), f"--model_path={model}", f"--num_executions={iterations}", f"--warmup={warmup}",
                    f"--cpu_threads={threads}", f"--etdump_path={et}"]
            r = subprocess.run(argv, capture_output=True, timeout=300)
            if r.returncode != 0:
                raise SystemExit(f"runner failed: {r.stderr.decode(errors='replace')[-500:]}")
            sessions.append(np.asarray(analyze(et.read_bytes())["iterations_ms"]))
            et.unlink()
    return sessions


def bench_real(args) -> dict:
    model = model_path(args.model, args.blocks)
    t0 = time.monotonic()
    s = real_runs(args.real_runs, args.real_iterations, args.warmup, model, args.threads)
    wall = time.monotonic() - t0
    half = len(s) // 2
    half -= half % 6
    learn, evaluate = s[:half], s[half:]
    meds = np.array([np.median(x) for x in s])
    cvs = np.array([np.std(x, ddof=1) / np.mean(x) for x in s])
    pairs_learn = [learn[2 * i: 2 * i + 2] for i in range(len(learn) // 2)]
    model_nm = NoiseModel.from_sessions(pairs_learn, device="this host")
    lr = np.diff(np.log(meds))[::2]
    print(f"\n(b) real A/A on this host: {args.model}{args.blocks or ''} x {len(s)} runs of {args.real_iterations} "
          f"iterations (+{args.warmup} warm-up), {args.threads} thread(s), {wall:.0f} s; median latency "
          f"{np.median(meds):.4f} ms (run medians {meds.min():.4f}-{meds.max():.4f}), within-run CV median "
          f"{100 * np.median(cvs):.1f}%; consecutive-pair |log ratio| median {100 * np.median(np.abs(lr)):.1f}%, "
          f"max {100 * np.max(np.abs(lr)):.1f}%")
    print(f"  noise model learned on the first {len(learn)} runs ({len(pairs_learn)} pairs): sigma_between "
          f"{100 * model_nm.sigma_between:.2f}% (95% upper bound {100 * model_nm.sigma_upper():.2f}%), "
          f"within-session sd of log median {100 * math.sqrt(model_nm.within_var):.2f}%")
    out = {}
    print(f"  {'sessions/arm':<13}{'method':<14}{'coverage':>9}{'false claims':>14}   evaluated on")
    for k in (1, 3):
        blocks = [evaluate[i: i + 2 * k] for i in range(0, len(evaluate) - 2 * k + 1, 2 * k)]
        res = {m: ([], []) for m in METHODS}
        found = {"new default": [], "new learned": []}
        for j, blk in enumerate(blocks):
            a, b = arms(blk, k)
            sa, sb = summarize(a, n_boot=NEW_BOOT, seed=j), summarize(b, n_boot=NEW_BOOT, seed=j + 1)
            # the same real sessions with a true 10% speedup injected into the candidate arm
            sf = summarize([x / 1.10 for x in b], n_boot=NEW_BOOT, seed=j + 1)
            for m in found:
                found[m].append(verdict(sa, sf, noise=model_nm if m == "new learned" else None).verdict == "speedup")
            for m, (c, _, cl, _) in claims_by_method(a, b, sa, sb, model_nm, j, k).items():
                res[m][0].append(c)
                res[m][1].append(cl)
        for m in METHODS:
            cov, cl = res[m]
            if cov:
                print(f"  {k:<13}{m:<14}{pct(cov):>9}{pct(cl):>14}   {len(cov)} "
                      f"{'pairs' if k == 1 else 'A B B A A B blocks'} ({sum(cl)} claims)")
                out[(k, m)] = (float(np.mean(cov)), float(np.mean(cl)))
        print(f"  {'':<13}a true 10% speedup injected into the candidate sessions is found: "
              + ", ".join(f"{m} {pct(f).strip()}" for m, f in found.items()))
    print("  sessions per arm to resolve a difference on this host (verdict.plan_sessions, learned model): "
          + ", ".join(f"{int(100 * e)}%: {plan_sessions(model_nm, min_effect=e)}" for e in (0.02, 0.05, 0.10, 0.25)))
    return out


def bench_farm(args) -> dict:
    """(c): A/A through the real farm (server, worker, agent, runner, ETDump, ingest)."""
    import socket

    import httpx

    from sme2farm.client.api import FarmClient
    from sme2farm.protocol import TERMINAL, ExperimentSpec

    model = model_path(args.model, args.blocks)
    small, big = model_path("cnn_blocks", 2), model_path("cnn_blocks", 50)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="sme2-cal-farm-") as d:
        proc = subprocess.Popen([sys.executable, "-m", "sme2farm.farm.cli", "up", "--data-dir", d, "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            url, token_file = f"http://127.0.0.1:{port}", Path(d) / "token"
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("sme2-farm up did not come up")
                if token_file.exists():
                    try:
                        hdr = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
                        if httpx.get(f"{url}/devices", headers=hdr, timeout=2).json():
                            break
                    except (httpx.TransportError, ValueError):
                        pass
                time.sleep(0.3)
            client = FarmClient(url, token_file.read_text().strip(), timeout=120)
            spec = ExperimentSpec(sme2="off", iterations=args.real_iterations, warmup=args.warmup, threads=[args.threads],
                                  sessions=args.farm_sessions)

            def run(a: Path, vs: Path | None = None) -> dict:
                rep = client.submit(a, spec, vs_model=vs)
                while not all(r.status in TERMINAL for r in client.experiment(rep.id).runs):
                    time.sleep(0.2)
                return client.experiment_json(rep.id)

            t0 = time.monotonic()
            vs_rows, cmp_rows = [], []
            for i in range(args.farm):
                rep = run(model, model)
                [c] = [c for c in rep["comparisons"] if c.get("kind") == "model"]
                vs_rows.append(c)
                a, b = run(model), run(model)
                [c2] = client.compare(str(a["id"]), str(b["id"])).comparisons
                cmp_rows.append(c2)
            diff = [c for c in run(small, big)["comparisons"] if c.get("kind") == "model"][0]
            wall = time.monotonic() - t0
        finally:
            import signal as _signal

            os.killpg(proc.pid, _signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, _signal.SIGKILL)

    def line(name: str, rows: list[dict]) -> tuple[int, float]:
        claims = sum(c.get("verdict") in ("speedup", "slowdown") for c in rows)
        held = [c for c in rows if c.get("ci_low") is not None]
        cover = sum(c["ci_low"] <= 1.0 <= c["ci_high"] for c in held)
        ratios = ", ".join(f"{c['speedup']:.3f}" for c in rows if c.get("speedup"))
        print(f"  {name:<44} claims {claims}/{len(rows)}, interval holds 1.0 in {cover}/{len(held)}; ratios {ratios}")
        print(f"  {'':<44} verdicts: " + ", ".join(f"{v} {sum(c.get('verdict') == v for c in rows)}"
                                                   for v in ("no significant difference", "insufficient data", "speedup", "slowdown")))
        return claims, cover / max(len(held), 1)

    print(f"\n(c) real A/A through the farm on this host: {args.model}{args.blocks or ''}, {args.real_iterations} iterations "
          f"(+{args.warmup} warm-up), SME2 off, {args.threads} thread(s), {args.farm_sessions} session(s) per arm; {wall:.0f} s")
    out = {"vs": line("--vs A/A (one experiment, A vs A)", vs_rows), "compare": line("compare of two experiments", cmp_rows)}
    last = cmp_rows[-1].get("noise") or {}
    print(f"  device noise model at the end: {last.get('source')}, sigma_between {100 * (last.get('sigma_between_prior') or 0):.1f}% "
          f"(prior df {last.get('prior_df')})")
    print(f"  clearly different models (cnn_blocks 2 vs 50 blocks, --vs): ratio {diff.get('speedup') or float('nan'):.3f} "
          f"[{diff.get('ci_low') or float('nan'):.3f}, {diff.get('ci_high') or float('nan'):.3f}], verdict {diff.get('verdict')}")
    out["different"] = diff.get("verdict")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=300, help="simulated A/A trials per row")
    p.add_argument("--power-trials", type=int, default=100, help="simulated A/B trials per power row")
    p.add_argument("--n", type=int, default=40, help="iterations per simulated session")
    p.add_argument("--k-prior", type=int, default=20, help="A/A pairs the simulated noise model is learned from")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-sim", action="store_true")
    p.add_argument("--no-real", action="store_true")
    p.add_argument("--real-runs", type=int, default=200, help="runner processes for the real A/A (even)")
    p.add_argument("--real-iterations", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default="toy_cnn")
    p.add_argument("--blocks", type=int, default=None, help="cnn_blocks only (the study in docs/design.md used 12)")
    p.add_argument("--farm", type=int, default=0, metavar="R",
                   help="(c) also R A/A experiments (--vs) and R compared experiment pairs through a real farm")
    p.add_argument("--farm-sessions", type=int, default=1, help="sessions per arm in (c) (interleaved A B B A)")
    args = p.parse_args(argv)
    if args.real_runs < 24:
        p.error("--real-runs must be >= 24 (half learns, half evaluates in blocks of six)")
    t0, c0 = time.monotonic(), time.process_time()
    if not args.no_sim:
        bench_sim(args)
    if not args.no_real:
        bench_real(args)
    if args.farm:
        bench_farm(args)
    print(f"\ntotal {time.monotonic() - t0:.0f} s wall, {time.process_time() - c0:.0f} s CPU; goals: coverage >= 93%, false claims <= 5%, "
          "a true 10% difference at CV <= 3% found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
