//! Answering a stream of messages: each message answered as a call of its own, several at a
//! time, their answers sent in the messages' order.

use futures_util::{Stream, StreamExt as _};
use std::future::Future;
use std::pin::Pin;
use tonic::{Status, Streaming};

/// At most this many messages of one stream are being answered at once. Past it the server
/// reads no more of the stream until the oldest is answered and taken by the client, so a
/// client that sends faster than it reads is held back by HTTP/2 flow control rather than
/// buffered. Enough for a stream of short documents to fill a bulk batch.
pub(crate) const STREAM_IN_FLIGHT: usize = 256;

/// A stream call's answers.
pub(crate) type Answers<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// `answer`'s answer to each message of `messages`, at most [`STREAM_IN_FLIGHT`] at once, in
/// the messages' order. The first failure ends the stream with its status (a message the
/// server cannot decode too); the messages still in flight are dropped then, as they are
/// when the client cancels the stream, which takes their sequences out of the queue.
pub(crate) fn ordered<Req, Res, F, Fut>(messages: Streaming<Req>, answer: F) -> Answers<Res>
where
    Req: Send + 'static,
    Res: Send + 'static,
    F: Fn(Req) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Res, Status>> + Send + 'static,
{
    let answers = messages
        .map(move |message| {
            let answering = message.map(&answer);
            async move { answering?.await }
        })
        .buffered(STREAM_IN_FLIGHT)
        .scan(false, |failed, answer| {
            let more = (!*failed).then_some(answer);
            *failed = more.as_ref().is_none_or(Result::is_err);
            std::future::ready(more)
        });
    Box::pin(answers)
}
