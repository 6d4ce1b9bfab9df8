//! Client access rules (`auth_hba_file`): [`bypass_wire::hba`], decided per client by the front
//! door ([`bypass_frontdoor::login::choose_method`]).

pub use bypass_wire::auth::Method as HbaMethod;
pub use bypass_wire::hba::{Connection, Hba, HBA_RULES_MAX};
