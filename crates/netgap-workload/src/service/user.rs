//! The unprivileged user a root agent's server programs run as.
//!
//! A root agent never runs nginx, Apache or gmond as root: each program
//! runs as [`ServiceUser`] (`nobody`), owns only the run directory the
//! agent made for it, and so reads only what the agent wrote there. A
//! non-root agent's programs run as the agent's own user.

/// Who a service runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceUser {
    /// The user's name (`nobody`).
    pub name: String,
    /// Its user id.
    pub uid: u32,
    /// Its primary group id.
    pub gid: u32,
}

/// The name of the user a root agent's services run as.
pub(crate) const SERVICE_USER: &str = "nobody";

/// Why a root agent has no user to run its services as.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UserError {
    /// The host has no such user.
    #[error("this host has no user {name:?}, which a root agent runs its server programs as")]
    Missing {
        /// The user looked for ([`SERVICE_USER`]).
        name: &'static str,
    },
    /// The user database could not be read.
    #[error("looking up the user {name:?}: {source}")]
    Lookup {
        /// The user looked for ([`SERVICE_USER`]).
        name: &'static str,
        /// Why.
        source: nix::Error,
    },
}

impl ServiceUser {
    /// The user this agent's services run as: `Some` ([`SERVICE_USER`])
    /// when the agent runs as root, `None` (the agent's own user) when not.
    /// A root agent on a host with no such user is an error naming it.
    pub(crate) fn for_agent() -> Result<Option<ServiceUser>, UserError> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(None);
        }
        match nix::unistd::User::from_name(SERVICE_USER) {
            Ok(Some(u)) => Ok(Some(ServiceUser {
                name: u.name,
                uid: u.uid.as_raw(),
                gid: u.gid.as_raw(),
            })),
            Ok(None) => Err(UserError::Missing { name: SERVICE_USER }),
            Err(source) => Err(UserError::Lookup {
                name: SERVICE_USER,
                source,
            }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn a_root_agent_names_an_unprivileged_user_and_others_their_own() {
        let u = ServiceUser::for_agent().unwrap();
        if nix::unistd::geteuid().is_root() {
            let u = u.unwrap();
            assert_eq!(u.name, SERVICE_USER);
            assert_ne!(u.uid, 0);
            assert_ne!(u.gid, 0);
        } else {
            assert!(u.is_none());
        }
    }
}
