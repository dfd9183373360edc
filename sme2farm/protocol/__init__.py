"""The wire contract: the one definition of what the server, the worker, agents and clients
exchange. One module per resource, every public name re-exported here
(`from sme2farm.protocol import ExperimentSpec`):

- common: run statuses and which are terminal, artifact names, Celery task names, defaults,
  timestamps and the base models that refuse control characters;
- devices: device selectors, devices and runner builds as agents report them, GET /devices;
- runs: a run's report and the analysis report's sections (operators, kernels, kernel paths,
  memory, LLM phases), served as analysis/types.py defines them;
- experiments: the experiment spec, report, list and scaling view;
- agents: the agent protocol's messages and answers;
- comparisons: verdicts with their numerics (analysis/comparison_types.py), GET /comparisons;
- suites: nightly regression suites, series, changes, GET /regressions;
- ops: liveness, readiness and API tokens.

A neutral package (not under server/ or client/) so that every side imports the same
definitions, as both ends of a request are checked against the same model. Pydantic and the
analysis package (numpy) only: it must stay importable on lab hosts and laptops without
SQLAlchemy, Celery, FastAPI, torch or executorch (tests/test_packaging.py).
"""

from .common import (ACTIVE, AGENT_ARTIFACTS, ARTIFACT_MEDIA, ARTIFACT_NAMES, DEFAULT_INPUTS, DEFAULT_ITERATIONS,
                     DEFAULT_METHOD, DEFAULT_MIN_EFFECT, DEFAULT_POWER_PROFILE, DEFAULT_SERVER_URL, DEFAULT_TIMEOUT_S,
                     DEFAULT_WARMUP, DERIVED_ARTIFACTS, KERNEL_LOG, LATENCIES_CSV, MEMORY, NON_TERMINAL, OUTPUTS,
                     PERFETTO_JSON, REPORT_JSON, REPORT_MD, RUNNER_LOG, TASK_ALERT_WEBHOOK, TASK_DISPATCH, TASK_INGEST,
                     TASK_REAP, TASK_REPORT, TASK_SUITES_TICK, TASK_SUITE_ANALYZE, TERMINAL, TRACE, Conflict, Detail,
                     DeviceState, Flavour, IsoTimestamp, Platform, PowerProfile, RelayedJson, RelayedText,
                     RunnerPlatform, RunStatus, Sme2Request, Sme2Setting, status_values, Timestamp, Unprocessable,
                     ValidationIssue)
from .devices import CoreCluster, DeviceInfo, DeviceRead, DeviceSelector, RunnerInfo, abbreviated, sme_text
from .runs import (Allocations, AnalysisReport, Attribution, Coverage, KernelEntry, KernelPaths, Kernels, LatencyStats,
                   LlmCategories, LlmKernelPaths, LlmReport, LlmSamples, NotHidden, OffSme2, OperatorInstance,
                   ModuleTime, OperatorRow, OutputRecord, Outputs, PhaseCategories, PhaseInterval, PhaseKernelPaths,
                   ProgramMemory, RunDeviceState, RunnerMemory, RunReport, Sme2Advice, SourceRow, section_adapter)
from .experiments import (ClusterMask, DeviceScaling, ExperimentPage, Imported, ExperimentReport, ExperimentSpec,
                          ExperimentSummary, LlmSpec, RunGroup, ScalingArm, ScalingFastest, ScalingInterval,
                          ScalingPoint, ScalingRatio, ScalingRead)
from .agents import (AGENT_PROTOCOL, DELIVERY_PART, AgentDevices, AgentRegister, AgentRegistered, ArtifactDigest,
                     ArtifactStored, DeviceRefused, DevicesSynced, FinishAnswer, Heartbeat, HeartbeatAnswer,
                     LeaseRequest, RunAssignment, RunDelivery, RunFinish)
from .comparisons import (ArmMemory, CategoryShare, CategoryVerdict, Comparison, ComparisonPage, ComparisonRead,
                          ComparisonSide, CoverageCompared, KernelPathsCompared, LlmCompared, MemoryCompared,
                          ModuleVerdict, Needed, NoiseUsed, Numerics, OperatorVerdict, OutputNumerics, OutputTolerance,
                          PartVerdict, PhaseVerdict, ProgramMemoryCompared, Unmatched, VarianceComponents)
from .suites import (SUITE_METRICS, SUITE_NAME_PATTERN, DetectableStep, MemoryChange, PointMemory, RegressionRead,
                     RegressionWebhook, Series, SeriesChange, SeriesKey, SeriesLlm, SeriesPoint, SeriesRead,
                     SuiteDeleted, SuiteDetail, SuiteDeviceRead, SuiteModel, SuiteModelRead, SuitePatch, SuiteRead,
                     SuiteRunRead, SuiteRunStarted, SuiteSpec, SuiteThresholds)
from .ops import Health, Readiness, ReadinessCheck, TokenCreate, TokenCreated, TokenInfo, TokenScope

# Wire, StrictWire (inbound messages) and Read (answers) are the models' bases: in .common, not re-exported.

__all__ = [
    "ACTIVE", "AGENT_ARTIFACTS", "ARTIFACT_MEDIA", "ARTIFACT_NAMES", "DEFAULT_INPUTS", "DEFAULT_ITERATIONS",
    "DEFAULT_METHOD", "DEFAULT_MIN_EFFECT", "DEFAULT_POWER_PROFILE", "DEFAULT_SERVER_URL", "DEFAULT_TIMEOUT_S",
    "DEFAULT_WARMUP", "DERIVED_ARTIFACTS", "KERNEL_LOG", "LATENCIES_CSV", "MEMORY", "NON_TERMINAL", "OUTPUTS",
    "PERFETTO_JSON", "REPORT_JSON", "REPORT_MD", "RUNNER_LOG", "TASK_ALERT_WEBHOOK", "TASK_DISPATCH", "TASK_INGEST",
    "TASK_REAP", "TASK_REPORT", "TASK_SUITES_TICK", "TASK_SUITE_ANALYZE", "TERMINAL", "TRACE", "Conflict", "Detail",
    "DeviceState", "Flavour", "IsoTimestamp", "Platform", "PowerProfile", "RelayedJson", "RelayedText",
    "RunnerPlatform", "RunStatus",
    "Sme2Request", "Sme2Setting", "status_values", "Timestamp", "Unprocessable", "ValidationIssue", "CoreCluster",
    "DeviceInfo", "DeviceRead", "DeviceSelector", "RunnerInfo", "abbreviated", "sme_text", "Allocations", "AnalysisReport", "Coverage",
    "KernelEntry", "KernelPaths", "Kernels", "LatencyStats", "LlmCategories", "LlmKernelPaths", "LlmReport",
    "LlmSamples", "NotHidden", "OffSme2", "OperatorInstance", "OperatorRow", "PhaseCategories", "PhaseInterval",
    "PhaseKernelPaths", "ProgramMemory", "RunnerMemory", "RunReport", "Sme2Advice", "Attribution", "ModuleTime",
    "SourceRow", "OutputRecord", "Outputs", "RunDeviceState", "section_adapter", "ClusterMask", "DeviceScaling",
    "ExperimentPage", "Imported", "ExperimentReport", "ExperimentSpec", "ExperimentSummary", "LlmSpec", "RunGroup", "ScalingArm",
    "ScalingFastest", "ScalingInterval", "ScalingPoint", "ScalingRatio", "ScalingRead", "AGENT_PROTOCOL",
    "DELIVERY_PART", "AgentDevices", "AgentRegister", "AgentRegistered", "ArtifactDigest", "ArtifactStored",
    "DeviceRefused", "DevicesSynced", "FinishAnswer", "Heartbeat", "HeartbeatAnswer", "LeaseRequest", "RunAssignment",
    "RunDelivery", "RunFinish", "ArmMemory", "CategoryShare", "CategoryVerdict", "ModuleVerdict", "Needed",
    "NoiseUsed", "OperatorVerdict", "VarianceComponents", "Comparison", "ComparisonPage", "ComparisonRead", "ComparisonSide",
    "CoverageCompared", "KernelPathsCompared", "LlmCompared", "MemoryCompared", "Numerics", "OutputNumerics",
    "OutputTolerance", "PartVerdict", "PhaseVerdict", "ProgramMemoryCompared", "Unmatched", "SUITE_METRICS",
    "SUITE_NAME_PATTERN", "DetectableStep", "MemoryChange", "PointMemory", "RegressionRead", "RegressionWebhook",
    "Series", "SeriesChange", "SeriesKey", "SeriesLlm", "SeriesPoint", "SeriesRead", "SuiteDeleted", "SuiteDetail",
    "SuiteDeviceRead", "SuiteModel", "SuiteModelRead", "SuitePatch", "SuiteRead", "SuiteRunRead", "SuiteRunStarted",
    "SuiteSpec", "SuiteThresholds", "Health", "Readiness", "ReadinessCheck", "TokenCreate", "TokenCreated", "TokenInfo",
    "TokenScope",
]
