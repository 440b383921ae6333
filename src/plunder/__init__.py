"""plunder: a job queue built on work stealing over a transactional database."""

import logging

from plunder.app import App
from plunder.context import AsyncConnection, Context
from plunder.errors import (
    AccessDenied,
    ConfigError,
    InvalidName,
    InvalidTransition,
    JobFailed,
    JobNotFound,
    LimitPaused,
    OutcomeUnknown,
    PayloadError,
    PlunderError,
    SchemaError,
    SessionGone,
    StaleClaim,
    StaleLease,
    StoreBusy,
    StoreError,
    StoreFull,
    StoreRefused,
    StoreUnavailable,
    UnknownTask,
)
from plunder.flows import Flow, Workflow, call
from plunder.handle import Job
from plunder.model import (
    Claim,
    ErrorInfo,
    JobRecord,
    JobSpec,
    Lease,
    Limit,
    LimitState,
    QueueStats,
    Run,
    Session,
    StreamEvent,
)
from plunder.states import Outcome, Status
from plunder.store import Store, open_store
from plunder.task import Task

__version__ = "0.1.0"

# plunder's loggers print only where the application set up logging: without this,
# logging's last-resort handler would write their warnings on the user's stderr
logging.getLogger("plunder").addHandler(logging.NullHandler())

__all__ = [
    "AccessDenied",
    "App",
    "AsyncConnection",
    "Claim",
    "ConfigError",
    "Context",
    "ErrorInfo",
    "Flow",
    "InvalidName",
    "InvalidTransition",
    "Job",
    "JobFailed",
    "JobNotFound",
    "JobRecord",
    "JobSpec",
    "Lease",
    "Limit",
    "LimitPaused",
    "LimitState",
    "Outcome",
    "OutcomeUnknown",
    "PayloadError",
    "PlunderError",
    "QueueStats",
    "Run",
    "SchemaError",
    "Session",
    "SessionGone",
    "StaleClaim",
    "StaleLease",
    "Status",
    "Store",
    "StoreBusy",
    "StoreError",
    "StoreFull",
    "StoreRefused",
    "StoreUnavailable",
    "StreamEvent",
    "Task",
    "UnknownTask",
    "Workflow",
    "__version__",
    "call",
    "open_store",
]
