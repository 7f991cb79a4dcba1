//! One grant request, whichever verb the backend answers it with (plain, fenced or queued),
//! and its answer in one shape.

use crate::contract::Op;
use crate::rt::error::Result;

/// What a grant request got: the key (with its fence when fenced), or held (with the
/// latest useful moment to try again, when the backend's queue knows it).
pub(crate) enum GrantAnswer {
    Granted(Option<u64>),
    Held(Option<f64>),
}

/// A grant request.
pub(crate) enum GrantOp {
    Plain(Op<bool>),
    Fenced(Op<Option<u64>>),
    Queued(Op<crate::contract::Queued>),
}

impl GrantOp {
    pub(crate) fn is_ready(&self) -> bool {
        match self {
            GrantOp::Plain(op) => op.is_ready(),
            GrantOp::Fenced(op) => op.is_ready(),
            GrantOp::Queued(op) => op.is_ready(),
        }
    }

    pub(crate) fn abandon(&mut self) {
        match self {
            GrantOp::Plain(op) => op.abandon(),
            GrantOp::Fenced(op) => op.abandon(),
            GrantOp::Queued(op) => op.abandon(),
        }
    }
}

impl std::future::Future for GrantOp {
    type Output = Result<GrantAnswer>;
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use crate::contract::Queued;
        use std::pin::Pin;
        use std::task::Poll;
        let grant = match self.get_mut() {
            GrantOp::Plain(op) => match Pin::new(op).poll(cx) {
                Poll::Ready(r) => r.map(|won| {
                    if won {
                        GrantAnswer::Granted(None)
                    } else {
                        GrantAnswer::Held(None)
                    }
                }),
                Poll::Pending => return Poll::Pending,
            },
            GrantOp::Fenced(op) => match Pin::new(op).poll(cx) {
                Poll::Ready(r) => r.map(|fence| match fence {
                    Some(f) => GrantAnswer::Granted(Some(f)),
                    None => GrantAnswer::Held(None),
                }),
                Poll::Pending => return Poll::Pending,
            },
            GrantOp::Queued(op) => match Pin::new(op).poll(cx) {
                Poll::Ready(r) => r.map(|q| match q {
                    Queued::Granted(fence) => GrantAnswer::Granted(fence),
                    Queued::Waiting { retry_in } => GrantAnswer::Held(retry_in),
                }),
                Poll::Pending => return Poll::Pending,
            },
        };
        Poll::Ready(grant)
    }
}
