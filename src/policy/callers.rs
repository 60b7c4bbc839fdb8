//! Who may pin and who may name a session (`docs/semantics.md` §7): the caller is the name the
//! edge's authentication put in the identity header, after removing any client copy of it.

use serde::Deserialize;

use super::error::{Privilege, RouteError, quoted};
use super::pins::Pins;

/// The header Envoy's `api_key_auth` (or `jwt_authn`) names the caller in, by default.
pub const DEFAULT_IDENTITY_HEADER: &str = "x-client-id";

/// The operator's rules. A list that is absent allows every caller; an empty one, none.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallerRules {
    #[serde(default = "default_identity_header")]
    pub header: String,
    /// The callers whose pins (headers or `nvext`) are obeyed; any other's pin is refused.
    #[serde(default)]
    pub may_pin: Option<Vec<String>>,
    /// The callers who may send `x-dynamo-session-id`.
    #[serde(default)]
    pub may_use_sessions: Option<Vec<String>>,
}

fn default_identity_header() -> String {
    DEFAULT_IDENTITY_HEADER.into()
}

impl CallerRules {
    /// Refuses the pins of a caller not allowed to pin, and a session of one not allowed one.
    pub fn check(
        &self,
        caller: Option<&str>,
        pins: &Pins,
        session: bool,
    ) -> Result<(), RouteError> {
        if !pins.is_empty() && !listed(self.may_pin.as_deref(), caller) {
            return Err(refusal(caller, Privilege::Pin));
        }
        if session && !listed(self.may_use_sessions.as_deref(), caller) {
            return Err(refusal(caller, Privilege::Session));
        }
        Ok(())
    }
}

fn listed(allowed: Option<&[String]>, caller: Option<&str>) -> bool {
    match (allowed, caller) {
        (None, _) => true,
        (Some(names), Some(caller)) => names.iter().any(|name| name == caller),
        (Some(_), None) => false,
    }
}

fn refusal(caller: Option<&str>, privilege: Privilege) -> RouteError {
    RouteError::NotPermitted {
        caller: caller.map_or_else(
            || "an unnamed caller".into(),
            |c| format!("caller {}", quoted(c)),
        ),
        privilege,
    }
}

#[cfg(test)]
#[path = "tests/callers.rs"]
mod tests;
