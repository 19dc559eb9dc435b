//! A PostgreSQL database of the test's own on the server CI runs on 127.0.0.1:5432 (or
//! `MCP_GATEWAY_TEST_POSTGRES`), made with `psql` and dropped after, or on demand to take it
//! away mid-run. It never touches a database it did not create.

/// A database of its own on the PostgreSQL server CI runs on 127.0.0.1:5432, dropped after.
pub struct Postgres {
    server: String,
    name: String,
    pub url: String,
}

impl Postgres {
    fn psql(server: &str, sql: &str) {
        let out = std::process::Command::new("psql")
            .args([
                &format!("{server}/postgres"),
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .expect("psql (PostgreSQL client) on PATH");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn create(what: &str) -> Postgres {
        // `psql` runs as a child process: an in-process gateway could reap it under us.
        super::claim_harness("child-process");
        let server = std::env::var("MCP_GATEWAY_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
        let name = format!("mcpgw_test_{what}_{}", std::process::id());
        Postgres::psql(&server, &format!("DROP DATABASE IF EXISTS {name}"));
        Postgres::psql(&server, &format!("CREATE DATABASE {name}"));
        Postgres {
            url: format!("{server}/{name}"),
            server,
            name,
        }
    }

    /// Drops the database now, cutting off whoever is connected (a database gone mid-run).
    pub fn destroy(&self) {
        Postgres::psql(
            &self.server,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.destroy();
    }
}
