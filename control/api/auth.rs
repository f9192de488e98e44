//! Who may call: API keys on the inference routes, control-plane keys on
//! the admin routes, and the audit trail of every admin change.
//!
//! Why it exists: anyone who reaches the port could otherwise use the
//! fleet, or register a worker of their own through `POST /workers` and so
//! receive other users' prompts.
//!
//! - Inference routes take `Authorization: Bearer KEY` (and `x-api-key:
//!   KEY` on `/v1/messages`, as Anthropic clients send it) when keys are
//!   configured. The key names a [`Tenant`], put in the request's (and
//!   the response's) extensions and on the request's log span; without keys
//!   every request is tenant `anonymous` (not written on the span).
//! - Admin routes take control-plane keys: an `admin` key may do
//!   everything, a `viewer` key only read (`GET`). Without keys the admin
//!   routes are only served on the admin listener (loopback by default),
//!   and the caller is known by its address.
//! - Every admin request that changes something, and every refused admin
//!   request, writes one line to the `smg::audit` log target: who, what,
//!   and the outcome.
//!
//! The gates run before the body limit: a caller without a key never makes
//! the gateway buffer a body.
//!
//! Presented keys are hashed (BLAKE3) and compared by digest against every
//! configured key, in constant time, so neither a key's bytes nor which key
//! matched show in the time taken.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request};
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Method, header};

use super::http::refusal;
use crate::config::{AdminRole, AuthConfig, KeyDigest};
use crate::error::{Error, ErrorCode};

/// The tenant of requests when no inference key is configured.
pub const ANONYMOUS: &str = "anonymous";

/// The log target of admin audit lines.
pub const AUDIT_TARGET: &str = "smg::audit";

/// The tenant a request is served for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub Arc<str>);

impl Tenant {
    pub fn name(&self) -> &str {
        &self.0
    }
}

/// Who called an admin route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operator {
    /// A control-plane key.
    Key {
        id: Arc<str>,
        name: Arc<str>,
        role: AdminRole,
    },
    /// A caller of the admin listener (no keys configured), by address.
    Local { peer: Option<SocketAddr> },
}

impl Operator {
    fn may(&self, method: &Method) -> bool {
        match self {
            Operator::Key {
                role: AdminRole::Viewer,
                ..
            } => reads_only(method),
            Operator::Key {
                role: AdminRole::Admin,
                ..
            }
            | Operator::Local { .. } => true,
        }
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operator::Key { id, name, role } => write!(f, "key {id} ({name}, {})", role.name()),
            Operator::Local { peer: Some(peer) } => write!(f, "admin listener client {peer}"),
            Operator::Local { peer: None } => f.write_str("admin listener client"),
        }
    }
}

fn reads_only(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD)
}

/// The digest table of some keys, each with what it stands for.
#[derive(Debug)]
struct KeyTable<T> {
    keys: Vec<(KeyDigest, T)>,
}

impl<T: Clone> KeyTable<T> {
    /// What `presented` stands for. Every key is compared, whichever
    /// matches, so the time taken does not depend on the match.
    fn find(&self, presented: &str) -> Option<T> {
        let digest = KeyDigest::of(presented);
        let mut found = None;
        for (key, value) in &self.keys {
            if key.matches(&digest) {
                found = Some(value);
            }
        }
        found.cloned()
    }
}

/// The inference routes' gate.
#[derive(Debug)]
pub(super) struct InferenceGate {
    keys: KeyTable<Tenant>,
    /// Also read `x-api-key` (Anthropic's header).
    accepts_x_api_key: bool,
    /// The tenant of every request when no key is configured (one `Arc`,
    /// cloned, rather than one allocated per request).
    anonymous: Tenant,
}

impl InferenceGate {
    /// The gate of `config`'s inference keys; `x_api_key`: whether the
    /// route also takes the key in `x-api-key`.
    pub(super) fn new(config: &AuthConfig, x_api_key: bool) -> Self {
        Self {
            keys: KeyTable {
                keys: config
                    .api_keys
                    .iter()
                    .map(|key| (key.digest.clone(), Tenant(Arc::from(key.tenant.as_str()))))
                    .collect(),
            },
            accepts_x_api_key: x_api_key,
            anonymous: Tenant(Arc::from(ANONYMOUS)),
        }
    }

    /// The tenant of a request with these headers, or why it is refused.
    fn admit(&self, headers: &HeaderMap) -> Result<Tenant, Error> {
        if self.keys.keys.is_empty() {
            return Ok(self.anonymous.clone());
        }
        let presented = bearer(headers).or_else(|| {
            self.accepts_x_api_key
                .then(|| header_text(headers, "x-api-key"))
                .flatten()
        });
        let Some(presented) = presented else {
            return Err(Error::new(
                ErrorCode::InvalidApiKey,
                "this route needs an API key: send `Authorization: Bearer <key>`",
            ));
        };
        self.keys
            .find(presented)
            .ok_or_else(|| Error::new(ErrorCode::InvalidApiKey, "the API key is not valid"))
    }
}

impl InferenceGate {
    /// Lets `request` through by its key, naming its tenant in its
    /// extensions and, when keys are configured, on the current (the
    /// request's) log span; or its refusal. Without keys every request is
    /// `anonymous`, which the span does not repeat: recording a field
    /// formats the span's fields again (about 2,000 instructions a request).
    pub(super) async fn pass(&self, mut request: Request) -> Result<(Request, Tenant), Response> {
        let tenant = match self.admit(request.headers()) {
            Ok(tenant) => tenant,
            Err(err) => return Err(unauthorized(&err, request).await),
        };
        if !self.keys.keys.is_empty() {
            tracing::Span::current().record("tenant", tenant.name());
        }
        request.extensions_mut().insert(tenant.clone());
        Ok((request, tenant))
    }
}

/// Where admin routes are served, and so who may call them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AdminAccess {
    /// On the public listener, behind control-plane keys.
    Keys,
    /// On the admin listener, to whoever reaches it.
    Listener,
}

/// The admin routes' gate.
#[derive(Debug)]
pub(super) struct AdminGate {
    keys: KeyTable<Operator>,
    access: AdminAccess,
}

impl AdminGate {
    pub(super) fn new(config: &AuthConfig, access: AdminAccess) -> Self {
        Self {
            keys: KeyTable {
                keys: config
                    .control_plane_keys
                    .iter()
                    .map(|key| {
                        let operator = Operator::Key {
                            id: Arc::from(key.id.as_str()),
                            name: Arc::from(key.name.as_str()),
                            role: key.role,
                        };
                        (key.digest.clone(), operator)
                    })
                    .collect(),
            },
            access,
        }
    }

    /// Who is calling, or why they may not.
    fn admit(&self, request: &Request) -> Result<Operator, Error> {
        let operator = match self.access {
            AdminAccess::Listener => Operator::Local {
                peer: request
                    .extensions()
                    .get::<ConnectInfo<SocketAddr>>()
                    .map(|info| info.0),
            },
            AdminAccess::Keys => {
                let presented = bearer(request.headers()).ok_or_else(|| {
                    Error::new(
                        ErrorCode::InvalidApiKey,
                        "admin routes need a control-plane key: send `Authorization: Bearer <key>`",
                    )
                })?;
                self.keys.find(presented).ok_or_else(|| {
                    Error::new(
                        ErrorCode::InvalidApiKey,
                        "the control-plane key is not valid",
                    )
                })?
            }
        };
        if !operator.may(request.method()) {
            return Err(Error::new(
                ErrorCode::PermissionDenied,
                "a viewer key may only read (GET) admin routes",
            ));
        }
        Ok(operator)
    }
}

/// An admin request let through: who made it, and what it asks, for its
/// audit line.
pub(super) struct AdminCall {
    operator: Operator,
    method: Method,
    path: String,
}

impl AdminGate {
    /// Lets `request` through by its control-plane key (or its listener),
    /// naming its [`Operator`] in its extensions; or its refusal, with the
    /// refusal's audit line written.
    pub(super) async fn pass(
        &self,
        mut request: Request,
    ) -> Result<(Request, AdminCall), Response> {
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        match self.admit(&request) {
            Ok(operator) => {
                request.extensions_mut().insert(operator.clone());
                Ok((
                    request,
                    AdminCall {
                        operator,
                        method,
                        path,
                    },
                ))
            }
            Err(err) => {
                let who = match self.access {
                    AdminAccess::Keys => "an unknown caller",
                    AdminAccess::Listener => "admin listener client",
                };
                tracing::warn!(
                    target: AUDIT_TARGET,
                    who = %who,
                    action = %format!("{method} {path}"),
                    outcome = "denied",
                    code = err.code.as_str(),
                    "admin request refused"
                );
                Err(unauthorized(&err, request).await)
            }
        }
    }
}

impl AdminCall {
    /// Writes the audit line of a change (reads are not audited).
    pub(super) fn audit(&self, response: &Response) {
        if reads_only(&self.method) {
            return;
        }
        let status = response.status();
        let outcome = if status.is_success() {
            "done"
        } else {
            "failed"
        };
        tracing::info!(
            target: AUDIT_TARGET,
            who = %self.operator,
            action = %format!("{} {}", self.method, self.path),
            outcome,
            status = status.as_u16(),
            "admin change"
        );
    }
}

/// The key in `Authorization: Bearer <key>`.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = header_text(headers, header::AUTHORIZATION.as_str())?;
    let (scheme, key) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| key.trim())
        .filter(|key| !key.is_empty())
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)?
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|text| !text.is_empty())
}

/// The refusal of a request that failed its gate: 401 (with the
/// `WWW-Authenticate` challenge) or 403. What the client is still sending
/// is read on briefly and discarded (never kept), so the client reads the
/// refusal rather than a connection reset.
async fn unauthorized(err: &Error, request: Request) -> Response {
    super::limits::discard(request.into_body()).await;
    let mut response = refusal(err);
    if err.code == ErrorCode::InvalidApiKey {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ApiKey, ControlPlaneKey};

    fn config() -> AuthConfig {
        AuthConfig {
            api_keys: vec![
                ApiKey {
                    tenant: "default".into(),
                    digest: KeyDigest::of("sk-main"),
                },
                ApiKey {
                    tenant: "team-a".into(),
                    digest: KeyDigest::of("sk-a"),
                },
            ],
            control_plane_keys: vec![
                ControlPlaneKey {
                    id: "ops".into(),
                    name: "alice".into(),
                    role: AdminRole::Admin,
                    digest: KeyDigest::of("cp-admin"),
                },
                ControlPlaneKey {
                    id: "dash".into(),
                    name: "grafana".into(),
                    role: AdminRole::Viewer,
                    digest: KeyDigest::of("cp-view"),
                },
            ],
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        map
    }

    #[test]
    fn inference_keys_name_their_tenant() {
        let gate = InferenceGate::new(&config(), false);
        let tenant = |pairs: &[(&str, &str)]| {
            gate.admit(&headers(pairs))
                .map(|t| t.name().to_owned())
                .map_err(|e| e.code)
        };
        assert_eq!(
            tenant(&[("authorization", "Bearer sk-a")]),
            Ok("team-a".into())
        );
        assert_eq!(
            tenant(&[("authorization", "bearer  sk-main ")]),
            Ok("default".into()),
            "the scheme is case-insensitive and the key trimmed"
        );
        for refused in [
            vec![],
            vec![("authorization", "Bearer sk-b")],
            vec![("authorization", "Basic sk-a")],
            vec![("authorization", "Bearer")],
            vec![("x-api-key", "sk-a")],
        ] {
            assert_eq!(
                tenant(&refused),
                Err(ErrorCode::InvalidApiKey),
                "{refused:?}"
            );
        }
        let messages = InferenceGate::new(&config(), true);
        assert_eq!(
            messages
                .admit(&headers(&[("x-api-key", "sk-a")]))
                .map(|t| t.name().to_owned()),
            Ok("team-a".into())
        );
    }

    #[test]
    fn without_keys_everyone_is_anonymous() {
        let gate = InferenceGate::new(&AuthConfig::default(), false);
        assert_eq!(
            gate.admit(&HeaderMap::new()).map(|t| t.name().to_owned()),
            Ok(ANONYMOUS.to_owned())
        );
    }

    fn admin_request(method: Method, key: Option<&str>) -> Request {
        let mut builder = http::Request::builder().method(method).uri("/workers");
        if let Some(key) = key {
            builder = builder.header("authorization", format!("Bearer {key}"));
        }
        builder.body(axum::body::Body::empty()).expect("request")
    }

    #[test]
    fn viewers_read_and_admins_change() {
        let gate = AdminGate::new(&config(), AdminAccess::Keys);
        let code = |method, key| gate.admit(&admin_request(method, key)).map_err(|e| e.code);
        assert!(matches!(
            code(Method::GET, Some("cp-view")),
            Ok(Operator::Key { ref id, .. }) if &**id == "dash"
        ));
        assert_eq!(
            code(Method::POST, Some("cp-view")),
            Err(ErrorCode::PermissionDenied)
        );
        assert_eq!(
            code(Method::DELETE, Some("cp-view")),
            Err(ErrorCode::PermissionDenied)
        );
        assert!(code(Method::POST, Some("cp-admin")).is_ok());
        assert_eq!(code(Method::GET, None), Err(ErrorCode::InvalidApiKey));
        assert_eq!(
            code(Method::GET, Some("sk-main")),
            Err(ErrorCode::InvalidApiKey),
            "an inference key opens no admin route"
        );
        let local = AdminGate::new(&AuthConfig::default(), AdminAccess::Listener);
        assert!(matches!(
            local.admit(&admin_request(Method::POST, None)),
            Ok(Operator::Local { .. })
        ));
    }
}
