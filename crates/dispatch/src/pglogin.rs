//! The client side of connection start: [`bypass_wire::login`] (one sans-I/O login for every
//! part), re-exported under its old path, with its errors as [`DispatchError`]s.

pub use bypass_wire::login::{Login, LoginError, LoginRequest, LoginStep, Welcome};

use crate::error::DispatchError;

impl From<LoginError> for DispatchError {
    fn from(error: LoginError) -> Self {
        match error {
            LoginError::Server { code, message } => DispatchError::Server { code, message },
            LoginError::Protocol(text) => DispatchError::Protocol(text),
            LoginError::Wire(error) => DispatchError::Wire(error),
        }
    }
}

/// An ErrorResponse as a typed error.
pub fn server_error(fields: &bypass_wire::backend::Fields<'_>) -> DispatchError {
    bypass_wire::login::server_error(fields).into()
}
