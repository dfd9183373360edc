"""Suites: stored models run on a schedule, one series per model x device model x sme2 x threads,
and nightly regression detection over those series (analysis/regression.py).

- A suite run is one experiment per model (services/experiments.create), linked to the run by
  `suite_experiments`. The beat's tick (TASK_SUITES_TICK, every SME2_SUITE_TICK_S) starts the
  suites whose cron schedule is due; POST /suites/{name}/run starts one by hand (runs.py).
- When a suite experiment's last run ends, end_run calls :func:`experiment_ended`, which only
  asks for TASK_SUITE_ANALYZE after the commit (end_run stays one indexed lookup slower, for
  suite experiments only). :func:`analyze` then, once every experiment of the suite run has
  ended, records one point per series key (raw samples per session, runner build, ExecuTorch
  version, device state), runs the detector over each touched series with the device's noise
  model and the device's canary series, and stores the changes it flagged (detection.py).
- Confirmed model changes nobody acknowledged are alerts: POSTed to the suite's webhook by
  TASK_ALERT_WEBHOOK (services/alerts.py), after the commit, with bounded retries. Latency's, and
  the other metrics' (changes.py): memory past the suite's memory threshold, an LLM's phases.
- A canary suite's consecutive points teach the device's noise model (services/noise.learn).

One job per module: schedule.py (cron, webhook), crud.py (store, change, delete, look up),
runs.py (start suite runs, the end_run hook), detection.py (points, detection), changes.py (the
change rows of every metric, memory and LLM-phase detection), reads.py (the read models the routes
answer, acknowledging a change). This package's names are theirs.
"""

from sme2farm.server.services.suites.crud import create, delete, get, get_all, sme2_warnings, update_suite
from sme2farm.server.services.suites.detection import (analyze, detect_series, detectable_step,
                                                       detectable_step_levels, device_model_of, key_of, sentence_for,
                                                       series_points)
from sme2farm.server.services.suites.reads import (SPREAD, acknowledge, detail, redact, regression_read, regressions,
                                                   run_started, runs_of, series, suite_read)
from sme2farm.server.services.suites.runs import (SUITE_LABEL, SUITE_RUN_LABEL, all_ended, experiment_ended, start_due,
                                                  start_run)
from sme2farm.server.services.suites.schedule import check_schedule, check_webhook, next_fire

__all__ = [
    "SPREAD", "SUITE_LABEL", "SUITE_RUN_LABEL", "acknowledge", "all_ended", "analyze", "check_schedule", "check_webhook",
    "create", "delete", "detail", "detect_series", "detectable_step", "detectable_step_levels", "device_model_of",
    "experiment_ended", "get", "get_all", "key_of", "next_fire", "redact", "regression_read", "regressions",
    "run_started", "runs_of", "sentence_for", "series", "series_points", "sme2_warnings", "start_due", "start_run",
    "suite_read", "update_suite",
]
