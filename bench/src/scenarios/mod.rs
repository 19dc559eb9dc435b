//! The scenarios of the main table that are more than a load run (`load` has (a) and (b)):
//! (c) idle sessions, (d) a new session's latency, the share of the in-process ceiling, and
//! (e) the cost of resumable streams. Each measures one target (or one pair) and returns its
//! part of the report; the full run and the subcommands of the same names call them.

mod ceiling;
mod idle;
mod latency;
mod resumable;

pub(crate) use ceiling::{CeilingShare, ceiling_share};
pub(crate) use idle::{IdleReport, idle_sessions};
pub(crate) use latency::{Latency, first_call_latency};
pub(crate) use resumable::{ResumableCost, resumable_cost};
