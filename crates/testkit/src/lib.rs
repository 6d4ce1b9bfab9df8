//! Throwaway PostgreSQL and PgBouncer for tests and benchmarks.
