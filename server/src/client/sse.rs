//! Server-sent events read from a byte stream. The bytes go through `eventsource-stream`, which
//! keeps an incomplete UTF-8 sequence and an incomplete line for the next read: a character or a
//! frame split across two network reads arrives whole. Every reader of the API's event streams
//! (the command line, the test suites) decodes with this one function.

use eventsource_stream::{EventStreamError, Eventsource};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};

/// The event names the API's streams send.
pub use crate::live::names;

/// One event of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// Its `event:` name (`message` when the frame names none).
    pub event: String,
    /// Its `id:`, if it has one.
    pub id: Option<String>,
    /// Its `data:` lines, joined by newlines.
    pub data: String,
}

/// Why a stream could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SseError {
    #[error("reading the event stream")]
    Transport(#[source] reqwest::Error),
    /// The server sent bytes that are not UTF-8 (never split characters: those are kept whole).
    #[error("the event stream is not UTF-8")]
    Utf8(#[source] std::string::FromUtf8Error),
    #[error("the event stream is malformed: {0}")]
    Malformed(String),
}

/// The events of a stream of byte chunks, however the chunks cut the text.
pub fn decode<S, B>(bytes: S) -> BoxStream<'static, Result<SseEvent, SseError>>
where
    S: Stream<Item = Result<B, reqwest::Error>> + Send + 'static,
    B: AsRef<[u8]> + Send + 'static,
{
    bytes
        .eventsource()
        .map(|item| match item {
            Ok(e) => Ok(SseEvent {
                event: e.event,
                id: (!e.id.is_empty()).then_some(e.id),
                data: e.data,
            }),
            Err(EventStreamError::Transport(e)) => Err(SseError::Transport(e)),
            Err(EventStreamError::Utf8(e)) => Err(SseError::Utf8(e)),
            Err(EventStreamError::Parser(e)) => Err(SseError::Malformed(e.to_string())),
        })
        .boxed()
}

/// The events of an opened `text/event-stream` response.
pub fn events(response: reqwest::Response) -> BoxStream<'static, Result<SseEvent, SseError>> {
    decode(response.bytes_stream())
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;

    async fn decode_chunks(chunks: Vec<Vec<u8>>) -> Vec<SseEvent> {
        let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, reqwest::Error>));
        decode(stream).try_collect().await.unwrap()
    }

    const FRAMES: &str = "event: log\nid: 7\ndata: {\"offset\":0,\"text\":\"h\u{e9}llo \u{2713} \u{65e5}\u{672c}\\n\"}\n\n\
                          : keep-alive\n\n\
                          event: end\r\ndata: {\"status\":\"finished\"}\r\n\r\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            SseEvent {
                event: names::LOG.into(),
                id: Some("7".into()),
                data: "{\"offset\":0,\"text\":\"h\u{e9}llo \u{2713} \u{65e5}\u{672c}\\n\"}".into(),
            },
            SseEvent {
                event: names::END.into(),
                id: Some("7".into()),
                data: "{\"status\":\"finished\"}".into(),
            },
        ]
    }

    #[tokio::test]
    async fn events_fed_one_byte_at_a_time_keep_every_multi_byte_character() {
        let chunks = FRAMES.bytes().map(|b| vec![b]).collect();
        assert_eq!(decode_chunks(chunks).await, expected());
    }

    #[tokio::test]
    async fn events_cut_at_every_position_decode_the_same() {
        let bytes = FRAMES.as_bytes();
        for cut in 1..bytes.len() {
            let chunks = vec![bytes[..cut].to_vec(), bytes[cut..].to_vec()];
            assert_eq!(decode_chunks(chunks).await, expected(), "cut at byte {cut}");
        }
    }

    #[tokio::test]
    async fn a_stream_that_is_not_utf8_is_an_error_not_replacement_characters() {
        let chunks = vec![b"event: log\ndata: \xff\xfe\n\n".to_vec()];
        let stream = futures::stream::iter(chunks.into_iter().map(Ok::<_, reqwest::Error>));
        let all: Vec<_> = decode(stream).collect().await;
        assert!(
            all.iter().any(|r| matches!(r, Err(SseError::Utf8(_)))),
            "{all:?}"
        );
    }
}
