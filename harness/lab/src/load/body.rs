//! A request body made of shared chunks: a large prompt prepared once is sent by every
//! request without being copied.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// The concatenation of its chunks, with an exact length (sent as `content-length`).
#[derive(Debug, Clone, Default)]
pub struct ChunkedBody {
    chunks: VecDeque<Bytes>,
    remaining: u64,
}

impl ChunkedBody {
    pub fn new(chunks: impl IntoIterator<Item = Bytes>) -> Self {
        let chunks: VecDeque<Bytes> = chunks.into_iter().filter(|c| !c.is_empty()).collect();
        let remaining = chunks.iter().map(|c| c.len() as u64).sum();
        Self { chunks, remaining }
    }

    pub fn empty() -> Self {
        Self::default()
    }

    pub fn len(&self) -> u64 {
        self.remaining
    }

    pub fn is_empty(&self) -> bool {
        self.remaining == 0
    }
}

impl From<Bytes> for ChunkedBody {
    fn from(bytes: Bytes) -> Self {
        Self::new([bytes])
    }
}

impl Body for ChunkedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let next = self.chunks.pop_front();
        if let Some(chunk) = &next {
            self.remaining = self.remaining.saturating_sub(chunk.len() as u64);
        }
        Poll::Ready(next.map(|chunk| Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}
