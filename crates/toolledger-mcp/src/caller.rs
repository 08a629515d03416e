//! Who is calling: a principal from trusted configuration (stdio) or from a bearer token
//! (streamable HTTP), re-resolved from the principal store on every call.
//!
//! Over HTTP, [`bearer_auth`] runs before rmcp sees the request: a missing or unknown token is
//! answered `401 Unauthorized` and never dispatched. Known tokens are looked up by hash only
//! (the store keeps SHA-256 hex, never the token).

#[cfg(feature = "http")]
use std::sync::Arc;

#[cfg(feature = "http")]
use axum::extract::{Request, State};
#[cfg(feature = "http")]
use axum::http::{header, StatusCode};
#[cfg(feature = "http")]
use axum::middleware::Next;
#[cfg(feature = "http")]
use axum::response::{IntoResponse, Response};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use toolledger::authz::PrincipalStore;
use toolledger::model::{Error, Principal};

/// The name a bearer token resolved to; inserted into the HTTP request by [`bearer_auth`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthenticatedName(pub String);

/// The principal [`bearer_auth`] read with the token, for this request's caller (one read of
/// the principal store per request, not two).
#[cfg_attr(not(feature = "http"), allow(dead_code))]
#[derive(Clone, Debug)]
struct ReadWithToken(Caller);

/// Where a server takes its caller from.
#[derive(Clone, Debug)]
pub enum CallerSource {
    /// A fixed principal name from trusted configuration (`--principal NAME` on stdio).
    Configured(String),
    /// The principal a bearer token resolved to (HTTP); see [`bearer_auth`].
    BearerToken,
}

/// The resolved caller of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The principal's name (its subject).
    pub name: String,
    /// The principal as the store says it is now.
    pub principal: Principal,
}

/// The refusal of a caller that is not an active principal.
pub fn revoked() -> Error {
    Error::denied("the caller is not an active principal")
}

impl Caller {
    /// A caller known by name only, its principal not read: the tenant and subject are empty
    /// and it holds no role or scope, so nothing that checks them lets it through. Given to
    /// tools that read the principal themselves (see
    /// [`CallerRead::NameOnly`](crate::CallerRead::NameOnly)).
    pub fn unread(name: String) -> Caller {
        Caller {
            name,
            principal: Principal {
                tenant: String::new(),
                subject: String::new(),
                roles: Default::default(),
                scopes: Default::default(),
            },
        }
    }
}

impl CallerSource {
    /// The principal name of the request in `ctx` (the configured one, or the one its bearer
    /// token resolved to), without reading the principal store.
    pub fn name(&self, ctx: &RequestContext<RoleServer>) -> Result<String, Error> {
        match self {
            CallerSource::Configured(name) => Ok(name.clone()),
            CallerSource::BearerToken => ctx
                .extensions
                .get::<http::request::Parts>()
                .and_then(|p| p.extensions.get::<AuthenticatedName>())
                .map(|a| a.0.clone())
                .ok_or_else(revoked),
        }
    }

    /// Resolves the caller of the request in `ctx` as the principal store says it is now: read
    /// for this request (over HTTP, by [`bearer_auth`] with the token, when it ran), else read
    /// here.
    pub async fn resolve(
        &self,
        principals: &PrincipalStore,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Caller, Error> {
        if let CallerSource::BearerToken = self {
            let read = ctx
                .extensions
                .get::<http::request::Parts>()
                .and_then(|p| p.extensions.get::<ReadWithToken>());
            if let Some(ReadWithToken(caller)) = read {
                return Ok(caller.clone());
            }
        }
        let name = self.name(ctx)?;
        let principal = principals.resolve(&name).await?.ok_or_else(revoked)?;
        Ok(Caller { name, principal })
    }
}

/// Axum middleware (feature `http`): `Authorization: Bearer <token>` → [`AuthenticatedName`] in the request's
/// extensions, or `401` before anything else runs.
#[cfg(feature = "http")]
pub async fn bearer_auth(
    State(principals): State<Arc<PrincipalStore>>,
    request: Request,
    next: Next,
) -> Response {
    authenticate(&principals, request, |r| next.run(r)).await
}

/// [`bearer_auth`] with `next` the rest of the request's way.
#[cfg(feature = "http")]
pub(crate) async fn authenticate<F: std::future::Future<Output = Response>>(
    principals: &PrincipalStore,
    mut request: Request,
    next: impl FnOnce(Request) -> F,
) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
        .filter(|t| !t.is_empty())
        .map(str::to_string);
    let unauthorized = || {
        (
            StatusCode::UNAUTHORIZED,
            [
                (header::WWW_AUTHENTICATE, "Bearer"),
                (header::CONTENT_TYPE, "application/json"),
            ],
            "{\"error\":{\"code\":\"unauthorized\",\"message\":\"a valid bearer token is required\"}}",
        )
            .into_response()
    };
    let Some(token) = token else {
        return unauthorized();
    };
    match principals.resolve_token(&token).await {
        Ok(Some((name, principal))) => {
            let caller = Caller {
                name: name.clone(),
                principal,
            };
            request.extensions_mut().insert(AuthenticatedName(name));
            request.extensions_mut().insert(ReadWithToken(caller));
            next(request).await
        }
        Ok(None) => unauthorized(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "application/json")],
            "{\"error\":{\"code\":\"unavailable\",\"message\":\"store unavailable\"}}",
        )
            .into_response(),
    }
}
