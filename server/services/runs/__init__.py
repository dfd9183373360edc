"""The run lifecycle, owned here and only here: every transition of a Run, ingest's included, and
the one way a run ends.

    queued ─dispatch─► assigned ─claim's ack─► running ─deliver─► analyzing ─ingest─► succeeded
      │                 └──── lease expired: back to queued ───┘         │
      │                   (or failed after max_attempts; cancelled if asked) ├─► failed  (trace unusable;
      └─► cancelled      any of assigned/running ─deliver─► failed | cancelled │    ingest deadline x attempts)
      └─► unschedulable  its device offline past SME2_DEVICE_LOST_S          └─► cancelled
    unschedulable: decided at submission (or as above), never left. uploading: a protocol-1
    agent's (server/api/agents_v1.py), between its start (running) and its finish.

One job per module:

- status.py: the one writer of a run's status (`move`, checked against ALLOWED, conditional on the
  status read) and the ways a run ends (`end_run`, `cancel`), each completing its experiment's
  comparisons in the same transaction;
- assignment.py: queued -> assigned, a device's next queued run (dispatch, assign_next), and what
  an agent's claim reads back;
- lease.py: the lease owner's moves (heartbeat, deliver; protocol 1's start and finish);
- ingesting.py: analyzing -> succeeded | failed (the ingest task's transitions; the trace becomes
  rows in services/ingest.py);
- reaper.py: runs past their lease or their ingest deadline, and the queued runs of lost devices.

Tasks a transition needs (dispatch, ingest) are sent after the transaction commits
(db.enqueue_after_commit). This package's names are theirs; callers use them from here.
"""

from sme2farm.server.services.runs.assignment import (ASSIGNED_AGENTS, QUEUE_ORDER, assign_next,
                                                      assigned_to_agent, dispatch, hand_over)
from sme2farm.server.services.runs.ingesting import (INGEST_BATCH, INGEST_SILENT_BEATS, Ingester, NeedsSavepoint,
                                                     ingest,
                                                     ingest_deferred, ingest_heartbeat, ingest_started,
                                                     ingest_started_batch)
from sme2farm.server.services.runs.lease import check_lease, deliver, delivered, finish, heartbeat, start
from sme2farm.server.services.runs.reaper import end_lost_device_runs, reap_expired
from sme2farm.server.services.runs.status import (ALLOWED, CANCELLED_BY_USER, IllegalTransition, LeaseConflict,
                                                  StateChanged, cancel, complete, end_run, get, move, require,
                                                  runs_created)

__all__ = [
    "ALLOWED", "ASSIGNED_AGENTS", "CANCELLED_BY_USER", "INGEST_BATCH", "INGEST_SILENT_BEATS", "QUEUE_ORDER",
    "IllegalTransition", "Ingester", "NeedsSavepoint", "check_lease", "LeaseConflict", "StateChanged", "assign_next",
    "assigned_to_agent", "cancel", "complete", "deliver", "delivered", "dispatch", "end_lost_device_runs",
    "end_run", "finish", "get", "hand_over", "heartbeat", "ingest", "ingest_deferred", "ingest_heartbeat",
    "ingest_started",
    "ingest_started_batch", "move", "reap_expired", "require", "runs_created", "start",
]
