//! The HTTP client of a streamable HTTP upstream: reqwest, configured as rmcp configures its
//! own (no idle pooling; only same-origin 307/308 redirects, so headers never reach another
//! host), and sending each request's W3C trace context (`traceparent`, `tracestate`,
//! `baggage`) as HTTP headers as well as in its `_meta`, where the proxy puts it. An HTTP
//! server that reads trace context only from headers (a gateway, a collector-instrumented
//! framework) continues the proxy's trace too.

use std::collections::HashMap;
use std::sync::Arc;

use futures_core::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, GetMeta, JsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::Sse;

/// The trace context fields copied from `_meta` to headers.
const FIELDS: [&str; 3] = ["traceparent", "tracestate", "baggage"];

/// Redirects one request may follow.
const MAX_REDIRECTS: usize = 10;

/// reqwest, adding each request's trace context from its `_meta` as headers.
#[derive(Clone)]
pub(crate) struct TracedHttp(reqwest::Client);

impl TracedHttp {
    /// The client, or `None` when reqwest cannot build one (no TLS provider installed).
    pub(crate) fn new() -> Option<Self> {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .redirect(same_origin_redirects())
            .build()
            .ok()
            .map(TracedHttp)
    }
}

/// Follows only same-origin 307 and 308 redirects (they keep the method and body), at most
/// [`MAX_REDIRECTS`]: a cross-origin one would send the session id and the configured
/// headers to another host, so it is answered as the redirect itself.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    })
}

/// `headers` with the trace context of `message` (a request whose `_meta` carries one) added.
/// A field the operator configured as an upstream header is left as configured.
fn with_trace_context(
    message: &ClientJsonRpcMessage,
    mut headers: HashMap<HeaderName, HeaderValue>,
) -> HashMap<HeaderName, HeaderValue> {
    let JsonRpcMessage::Request(request) = message else {
        return headers;
    };
    let meta = request.request.get_meta();
    for field in FIELDS {
        let name = HeaderName::from_static(field);
        if headers.contains_key(&name) {
            continue;
        }
        let value = meta.get(field).and_then(|v| v.as_str());
        if let Some(value) = value.and_then(|v| HeaderValue::from_str(v).ok()) {
            headers.insert(name, value);
        }
    }
    headers
}

impl StreamableHttpClient for TracedHttp {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let limits = StreamableHttpResponseLimits::default();
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    /// Every POST comes here: the request's trace context is added to its headers.
    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let headers = with_trace_context(&message, custom_headers);
        self.0
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{
        CallToolRequest, CallToolRequestParams, ClientRequest, JsonRpcRequest, NumberOrString,
        RequestMetaObject,
    };
    use serde_json::json;

    fn call(meta: serde_json::Value) -> ClientJsonRpcMessage {
        let mut request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new("refund"),
        ));
        let meta: RequestMetaObject = serde_json::from_value(meta).unwrap();
        request.get_meta_mut().extend(meta);
        JsonRpcMessage::Request(JsonRpcRequest::new(NumberOrString::Number(1), request))
    }

    #[test]
    fn a_request_s_trace_context_becomes_headers_and_a_configured_header_stays() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let message = call(json!({"traceparent": tp, "tracestate": "k=v", "other": "x"}));
        let mut configured = HashMap::new();
        configured.insert(
            HeaderName::from_static("tracestate"),
            HeaderValue::from_static("set=by-operator"),
        );
        let headers = with_trace_context(&message, configured);
        assert_eq!(headers[&HeaderName::from_static("traceparent")], tp);
        assert_eq!(
            headers[&HeaderName::from_static("tracestate")],
            "set=by-operator"
        );
        assert!(!headers.contains_key(&HeaderName::from_static("baggage")));
        assert!(!headers.contains_key(&HeaderName::from_static("other")));
        assert_eq!(headers.len(), 2);
    }

    #[test]
    fn a_request_without_trace_context_adds_no_header() {
        let headers = with_trace_context(&call(json!({})), HashMap::new());
        assert!(headers.is_empty());
    }
}
