"""A stored experiment spec is read back as it was accepted: a spec an older farm stored, with a
field since dropped or a value a later check refuses, still reads (reports, scaling, suites read it)."""

from __future__ import annotations

from sme2farm.server.services.experiments import spec_of
from sme2farm.server.store.models import Experiment


def test_a_current_spec_reads_back_validated_with_defaults():
    spec = spec_of(Experiment(spec={"sme2": "off", "threads": [1, 2]}))
    assert spec.sme2 == "off" and spec.threads == [1, 2] and spec.iterations > 0


def test_an_older_spec_with_a_dropped_field_or_a_tightened_value_still_reads():
    older = spec_of(Experiment(spec={"sme2": "both", "threads": [4], "iterations": 50, "dropped_since": True}))
    assert (older.sme2, older.threads, older.iterations) == ("both", [4], 50)
    tightened = spec_of(Experiment(spec={"sme2": "on", "threads": list(range(1, 40))}))  # past today's 16
    assert tightened.sme2 == "on" and len(tightened.threads) == 39
