//! What one upstream attempt's outcome means, as a pure function: the next action of the chain
//! executor (commit the answer, try again, move to the next step, give up), what the step's
//! circuit breaker records, and the attempt's metric label. The exchange (`proxy::exchange`)
//! only performs the call and says what happened; `proxy::chain` alone acts on the verdict. The
//! rules are SPEC §5–§7, and the tests below walk them row by row.

use std::time::Duration;

use crate::policy::retry::{self, Verdict as StatusVerdict};

/// What happened in one attempt, without its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Happened {
    /// The step cannot be called at all (its provider has no key).
    Unsendable,
    /// The provider's admission gate shed the call.
    Shed,
    /// A success answer came that legate could not hold (its memory bound for answers is
    /// reached, and the answer must be whole to be translated). The provider answered: the
    /// attempt counts as `ok` and the breaker hears a success; fetching it again would meet
    /// the same full memory, so nothing more is tried.
    Unheld,
    /// The request's deadline passed: while waiting for a slot (`in_flight` false) or while
    /// waiting on the upstream.
    Deadline { in_flight: bool },
    /// No response headers within the provider's first-byte timeout.
    TimedOut,
    /// Connecting or sending failed.
    Unreachable,
    /// The TLS handshake failed (a certificate refused): the same provider would refuse it
    /// again at once, so the step is left for the next, without its retries.
    TlsRefused,
    /// A stream, or a whole body, broke (cut, stalled) before anything reached the caller.
    Broken,
    /// A stream read up to its commit point (its first content, or its clean end).
    Stream,
    /// A whole success answer.
    Whole,
    /// A cloud platform refused the credential (401, 403), which is now set aside and
    /// renewed: the call is tried again at once with the new one. Not the provider's failure,
    /// and not the request's refusal.
    CredentialRenewed,
    /// An error answer: an HTTP error status, or an error event before any content
    /// (`in_stream`, judged like the status it stands for).
    Error {
        status: u16,
        /// The body says a quota or spend limit is exhausted: waiting does not help.
        quota: bool,
        /// The upstream's retry-after, if it sent one.
        retry_after: Option<Duration>,
        in_stream: bool,
    },
}

/// Where the attempt stands in its chain step, and the limit on waiting for the same upstream.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    /// The request's deadline has passed.
    pub deadline_passed: bool,
    /// This was the step's last allowed attempt (`max_attempts`).
    pub last_attempt: bool,
    /// A retry-after longer than this moves on to the next step instead of waiting.
    pub max_retry_after: Duration,
}

/// What the chain executor does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Return this answer to the caller (a success, or an error another try would repeat).
    Commit,
    /// Try the same step again after the upstream's wait, or a backoff when None.
    Retry { wait: Option<Duration> },
    /// This step is unavailable: the next one may serve.
    NextStep,
    /// Nothing more can be tried.
    GiveUp(GiveUp),
}

/// Why nothing more can be tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    Deadline,
    Shed,
}

/// What the step's breaker records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    Success,
    /// A provider-side failure (5xx, 529, timeouts, connection errors, broken streams).
    Failure,
    /// Says nothing about the provider's health (4xx, 429, the caller's own deadline).
    Neutral,
    /// A committed stream: decided when it ends (a cut or error event after content fails).
    AtStreamEnd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub action: Action,
    pub breaker: Report,
    /// `legate_upstream_attempts_total{outcome}`; None when no call was made to count.
    pub label: Option<&'static str>,
}

const fn verdict(action: Action, breaker: Report, label: Option<&'static str>) -> Verdict {
    Verdict {
        action,
        breaker,
        label,
    }
}

/// Whether an error status may be retryable, so its (small) body must be read to decide.
pub fn worth_reading(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504 | 529)
}

/// The verdict on one attempt.
pub fn judge(happened: Happened, cx: Context) -> Verdict {
    use Happened as H;
    match happened {
        H::Unsendable => verdict(Action::NextStep, Report::Neutral, None),
        H::Shed => verdict(Action::GiveUp(GiveUp::Shed), Report::Neutral, None),
        H::Unheld => verdict(Action::GiveUp(GiveUp::Shed), Report::Success, Some("ok")),
        H::Deadline { in_flight } => verdict(
            Action::GiveUp(GiveUp::Deadline),
            // The caller's own deadline says nothing about the provider.
            Report::Neutral,
            in_flight.then_some("timeout"),
        ),
        H::TimedOut => again(cx, None, Report::Failure, "timeout"),
        H::Unreachable => again(cx, None, Report::Failure, "connect_error"),
        H::TlsRefused => verdict(Action::NextStep, Report::Failure, Some("connect_error")),
        // Broken by the deadline's timer, or broken once it had passed: either way the
        // caller's deadline ended it, and says nothing about the provider.
        H::Broken if cx.deadline_passed => verdict(
            Action::GiveUp(GiveUp::Deadline),
            Report::Neutral,
            Some("retryable"),
        ),
        H::Broken => again(cx, None, Report::Failure, "retryable"),
        H::Stream => verdict(Action::Commit, Report::AtStreamEnd, Some("ok")),
        H::Whole => verdict(Action::Commit, Report::Success, Some("ok")),
        H::CredentialRenewed => again(cx, Some(Duration::ZERO), Report::Neutral, "retryable"),
        H::Error {
            status,
            quota,
            retry_after,
            in_stream,
        } => error(status, quota, retry_after, in_stream, cx),
    }
}

fn error(
    status: u16,
    quota: bool,
    retry_after: Option<Duration>,
    in_stream: bool,
    cx: Context,
) -> Verdict {
    let fault = |f: bool| if f { Report::Failure } else { Report::Neutral };
    match retry::classify_status(status, quota) {
        StatusVerdict::Success => verdict(Action::Commit, Report::Success, Some("ok")),
        // A fallback must never route around a refusal: returned as it is.
        StatusVerdict::Final { provider_fault } => {
            verdict(Action::Commit, fault(provider_fault), Some("fatal"))
        }
        // Nothing reached the caller of a stream yet, but its time is up.
        StatusVerdict::Retryable { provider_fault } if in_stream && cx.deadline_passed => verdict(
            Action::GiveUp(GiveUp::Deadline),
            fault(provider_fault),
            Some("retryable"),
        ),
        StatusVerdict::Retryable { provider_fault } => {
            again(cx, retry_after, fault(provider_fault), "retryable")
        }
    }
}

/// A retryable failure: the same step again, unless its attempts are spent or the upstream
/// asks for a wait longer than a substitute answering now.
fn again(cx: Context, wait: Option<Duration>, breaker: Report, label: &'static str) -> Verdict {
    let action = match wait {
        _ if cx.last_attempt => Action::NextStep,
        Some(w) if w > cx.max_retry_after => Action::NextStep,
        wait => Action::Retry { wait },
    };
    verdict(action, breaker, Some(label))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::{Commit, NextStep, Retry};
    use Happened as H;
    use Report::{AtStreamEnd, Failure, Neutral};

    const CX: Context = Context {
        deadline_passed: false,
        last_attempt: false,
        max_retry_after: Duration::from_secs(60),
    };

    fn err(status: u16) -> Happened {
        H::Error {
            status,
            quota: false,
            retry_after: None,
            in_stream: false,
        }
    }

    fn row(h: Happened, cx: Context) -> (Action, Report, Option<&'static str>) {
        let v = judge(h, cx);
        (v.action, v.breaker, v.label)
    }

    /// SPEC §6 retries and breaker, §5 statuses passed through: every upstream status.
    #[test]
    fn error_statuses_row_by_row() {
        let retry = Retry { wait: None };
        let rows: [(u16, Action, Report, &str); 16] = [
            (400, Commit, Neutral, "fatal"),
            (401, Commit, Neutral, "fatal"),
            (402, Commit, Neutral, "fatal"),
            (403, Commit, Neutral, "fatal"),
            (404, Commit, Neutral, "fatal"),
            (408, retry, Neutral, "retryable"),
            (409, Commit, Neutral, "fatal"),
            (413, Commit, Neutral, "fatal"),
            (422, Commit, Neutral, "fatal"),
            (429, retry, Neutral, "retryable"),
            (500, retry, Failure, "retryable"),
            (501, Commit, Failure, "fatal"),
            (502, retry, Failure, "retryable"),
            (503, retry, Failure, "retryable"),
            (504, retry, Failure, "retryable"),
            (529, retry, Failure, "retryable"),
        ];
        for (status, action, breaker, label) in rows {
            assert_eq!(
                row(err(status), CX),
                (action, breaker, Some(label)),
                "{status}"
            );
        }
        assert_eq!(row(err(302), CX), (Commit, Report::Success, Some("ok")));
    }

    /// A refused cloud credential, set aside for a new one: tried again at once, neither the
    /// provider's fault nor the request's refusal; on the step's last attempt, the next step.
    #[test]
    fn a_renewed_credential_is_tried_again_at_once() {
        let now = Retry {
            wait: Some(Duration::ZERO),
        };
        let renewed = H::CredentialRenewed;
        assert_eq!(row(renewed, CX), (now, Neutral, Some("retryable")));
        let last = Context {
            last_attempt: true,
            ..CX
        };
        assert_eq!(row(renewed, last), (NextStep, Neutral, Some("retryable")));
    }

    #[test]
    fn quota_exhaustion_is_final_and_no_provider_fault() {
        let quota = H::Error {
            status: 429,
            quota: true,
            retry_after: None,
            in_stream: false,
        };
        assert_eq!(row(quota, CX), (Commit, Neutral, Some("fatal")));
    }

    #[test]
    fn retry_after_is_waited_unless_longer_than_the_limit() {
        let with = |secs| H::Error {
            status: 429,
            quota: false,
            retry_after: Some(Duration::from_secs(secs)),
            in_stream: false,
        };
        let wait = Some(Duration::from_secs(2));
        assert_eq!(judge(with(2), CX).action, Retry { wait });
        assert_eq!(judge(with(61), CX).action, NextStep);
    }

    #[test]
    fn the_last_attempt_moves_to_the_next_step() {
        let last = Context {
            last_attempt: true,
            ..CX
        };
        for h in [err(529), err(429), H::TimedOut, H::Unreachable, H::Broken] {
            assert_eq!(judge(h, last).action, NextStep, "{h:?}");
        }
        assert_eq!(judge(err(400), last).action, Commit);
    }

    /// SPEC §7: a stream that fails before its commit point is retried; an error event is
    /// judged like its status; past the deadline nothing more is tried.
    #[test]
    fn streams_before_the_commit_point() {
        let event = |status| H::Error {
            status,
            quota: false,
            retry_after: None,
            in_stream: true,
        };
        let late = Context {
            deadline_passed: true,
            ..CX
        };
        let deadline = Action::GiveUp(GiveUp::Deadline);
        assert_eq!(
            row(event(529), CX),
            (Retry { wait: None }, Failure, Some("retryable"))
        );
        assert_eq!(
            row(event(529), late),
            (deadline, Failure, Some("retryable"))
        );
        assert_eq!(
            row(event(429), late),
            (deadline, Neutral, Some("retryable"))
        );
        assert_eq!(row(event(400), late), (Commit, Neutral, Some("fatal")));
        assert_eq!(
            row(H::Broken, CX),
            (Retry { wait: None }, Failure, Some("retryable"))
        );
        // The caller's deadline broke it: nothing said about the provider.
        assert_eq!(row(H::Broken, late), (deadline, Neutral, Some("retryable")));
        // An HTTP error status is left to the executor's own deadline check.
        assert_eq!(judge(err(529), late).action, Retry { wait: None });
        assert_eq!(row(H::Stream, CX), (Commit, AtStreamEnd, Some("ok")));
    }

    #[test]
    fn calls_that_got_no_answer() {
        let deadline = Action::GiveUp(GiveUp::Deadline);
        let retry = Retry { wait: None };
        assert_eq!(row(H::TimedOut, CX), (retry, Failure, Some("timeout")));
        assert_eq!(
            row(H::Unreachable, CX),
            (retry, Failure, Some("connect_error"))
        );
        assert_eq!(
            row(H::Deadline { in_flight: true }, CX),
            (deadline, Neutral, Some("timeout"))
        );
        assert_eq!(
            row(H::Deadline { in_flight: false }, CX),
            (deadline, Neutral, None)
        );
        assert_eq!(
            row(H::Shed, CX),
            (Action::GiveUp(GiveUp::Shed), Neutral, None)
        );
        assert_eq!(row(H::Unsendable, CX), (NextStep, Neutral, None));
        assert_eq!(row(H::Whole, CX), (Commit, Report::Success, Some("ok")));
        assert_eq!(
            row(H::Unheld, CX),
            (Action::GiveUp(GiveUp::Shed), Report::Success, Some("ok"))
        );
    }

    #[test]
    fn only_retryable_statuses_have_their_bodies_read() {
        for s in [408, 429, 500, 502, 503, 504, 529] {
            assert!(worth_reading(s), "{s}");
        }
        for s in [400, 401, 402, 403, 404, 409, 413, 501] {
            assert!(!worth_reading(s), "{s}");
        }
    }
}
