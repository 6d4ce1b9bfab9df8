//! Services that run inside lab namespaces: PostgreSQL on each backend (a real cluster from
//! `bypass-testkit`, started from a thread inside the backend's namespace so the postmaster
//! inherits it).

use std::net::Ipv4Addr;
use std::path::PathBuf;

use bypass_testkit::{Postgres, PostgresOptions};

use crate::lab::{POSTGRES_PORT, PREFIX_LEN};
use bypass_dispatch::error::{DispatchError, Result};
use bypass_dispatch::netns;

/// A PostgreSQL cluster living in a lab namespace.
pub struct LabPostgres {
    /// `None` only while dropping.
    postgres: Option<Postgres>,
    pub namespace: String,
    pub address: Ipv4Addr,
}

impl LabPostgres {
    /// Starts a throwaway cluster in `namespace`, listening on loopback and on `address`, with
    /// trust for the lab subnet. `data_dir` makes it persistent (for `bypass lab up`).
    pub fn start(namespace: &str, address: Ipv4Addr, data_dir: Option<PathBuf>) -> Result<LabPostgres> {
        let options = PostgresOptions {
            port: Some(POSTGRES_PORT),
            extra_conf: vec![
                format!("listen_addresses = '127.0.0.1,{address}'"),
                // Large results are the point; keep the server from compressing or logging them.
                "log_min_duration_statement = -1".to_string(),
            ],
            max_connections: 200,
            data_dir,
            ..PostgresOptions::default()
        };
        let postgres = netns::run_in(namespace, move || {
            Postgres::start_with(options).map_err(|e| DispatchError::Lab(format!("starting PostgreSQL: {e}")))
        })?;
        let lab_postgres = LabPostgres { postgres: Some(postgres), namespace: namespace.to_string(), address };
        lab_postgres.trust_lab_subnet()?;
        Ok(lab_postgres)
    }

    fn postgres(&self) -> &Postgres {
        self.postgres.as_ref().expect("present until drop")
    }

    /// The testkit only trusts loopback; lab clients come from the lab subnet.
    fn trust_lab_subnet(&self) -> Result<()> {
        let hba = self.postgres().data_dir().join("pg_hba.conf");
        let text =
            std::fs::read_to_string(&hba).map_err(|e| DispatchError::io(format!("reading {}", hba.display()), e))?;
        let line = format!("host all all 10.0.0.0/{PREFIX_LEN} trust");
        if !text.lines().any(|l| l == line) {
            std::fs::write(&hba, format!("{text}{line}\n"))
                .map_err(|e| DispatchError::io(format!("writing {}", hba.display()), e))?;
        }
        self.psql("select pg_reload_conf()")?;
        Ok(())
    }

    /// Runs `sql` with psql inside the namespace (see `Postgres::psql`).
    pub fn psql(&self, sql: &str) -> Result<String> {
        let sql = sql.to_string();
        let postgres = self.postgres();
        // psql connects to 127.0.0.1 of the calling thread's namespace: run it from inside.
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    netns::enter(&self.namespace)?;
                    postgres.psql(&sql).map_err(|e| DispatchError::Lab(format!("psql: {e}")))
                })
                .join()
                .map_err(|_| DispatchError::Lab("psql thread panicked".into()))?
        })
    }

    pub fn port(&self) -> u16 {
        self.postgres().port()
    }

    /// Stops the server as if it crashed (`pg_ctl stop -m immediate`).
    pub fn kill(&mut self) {
        if let Some(postgres) = self.postgres.as_mut() {
            postgres.kill();
        }
    }

    /// Starts a killed server again.
    pub fn start_again(&mut self) -> Result<()> {
        let namespace = self.namespace.clone();
        let postgres = self.postgres.as_mut().expect("present until drop");
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    netns::enter(&namespace)?;
                    postgres.start_again().map_err(|e| DispatchError::Lab(format!("restarting PostgreSQL: {e}")))
                })
                .join()
                .map_err(|_| DispatchError::Lab("restart thread panicked".into()))?
        })
    }
}
