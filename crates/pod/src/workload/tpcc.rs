//! TPC-C with the full mix (NewOrder 45, Payment 43, OrderStatus 4, Delivery 4, StockLevel 4),
//! one warehouse per host, and Tigon's remote rules: a remote NewOrder takes its **first order
//! line** from another warehouse's stock; a remote Payment pays a customer of another warehouse.
//!
//! ```text
//!  table              key (u64)                                  partitioned by warehouse w
//!  WAREHOUSE          w
//!  DISTRICT           dk = w·10 + d
//!  CUSTOMER           ck = dk·4096 + c
//!  HISTORY            w << 56 | id                               insert-only
//!  NEW_ORDER, ORDER   dk << 32 | o                               ordered
//!  ORDER_LINE         dk << 40 | o << 4 | ol                     ordered
//!  ORDER_BY_CUSTOMER  ck << 28 | o                               ordered (OrderStatus' "last order")
//!  STOCK              w << 20 | i
//!  ITEM and the customer last-name index are read-only and replicated in every host's driver.
//! ```
//!
//! Money is in cents, rates in basis points. After a run each host checks TPC-C consistency
//! conditions 1–4 on its warehouse.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

use super::api::{field, Check, Driver, Workload};
use crate::access::{abort, update, Abort, Fetch, TxnError, TxnOps, TxnResult};
use crate::error::PodError;
use crate::partition::{Partition, TableId, TableSpec};
use crate::rng::{nurand, SplitMix64};

pub const WAREHOUSE: TableId = 0;
pub const DISTRICT: TableId = 1;
pub const CUSTOMER: TableId = 2;
pub const HISTORY: TableId = 3;
pub const NEW_ORDER: TableId = 4;
pub const ORDER: TableId = 5;
pub const ORDER_LINE: TableId = 6;
pub const STOCK: TableId = 7;
pub const ORDER_BY_CUSTOMER: TableId = 8;

const DISTRICTS_MAX: u64 = 10;
const CUSTOMERS_MAX: u64 = 4096;
const ITEMS_MAX: u64 = 1 << 20;
const ORDER_ID_MASK: u64 = (1 << 28) - 1;
/// Run-time constants of NURand (TPC-C 2.1.6), fixed so runs replay.
const C_CUSTOMER: u64 = 259;
const C_ITEM: u64 = 7911;
const C_LAST: u64 = 173;

const WAREHOUSE_BYTES: usize = 96;
const DISTRICT_BYTES: usize = 104;
const CUSTOMER_BYTES: usize = 560;
const HISTORY_BYTES: usize = 48;
const NEW_ORDER_BYTES: usize = 8;
const ORDER_BYTES: usize = 40;
const ORDER_LINE_BYTES: usize = 56;
const STOCK_BYTES: usize = 320;

#[derive(Debug, Clone, Serialize)]
pub struct TpccConfig {
    /// Percent of NewOrders whose first order line comes from another warehouse.
    pub remote_new_order_percent: u32,
    /// Percent of Payments for a customer of another warehouse.
    pub remote_payment_percent: u32,
    pub districts: u64,
    pub customers_per_district: u64,
    pub items: u64,
    /// NewOrder, Payment, OrderStatus, Delivery, StockLevel, in percent.
    pub mix: [u32; 5],
}

impl TpccConfig {
    /// Full-size warehouses (10 districts × 3000 customers, 100 000 items).
    pub fn standard(remote_new_order_percent: u32, remote_payment_percent: u32) -> TpccConfig {
        TpccConfig {
            remote_new_order_percent,
            remote_payment_percent,
            districts: 10,
            customers_per_district: 3000,
            items: 100_000,
            mix: [45, 43, 4, 4, 4],
        }
    }

    /// Small warehouses for tests (same shape, fewer rows).
    pub fn small(remote_new_order_percent: u32, remote_payment_percent: u32) -> TpccConfig {
        TpccConfig {
            customers_per_district: 60,
            items: 1000,
            ..TpccConfig::standard(remote_new_order_percent, remote_payment_percent)
        }
    }

    pub fn problems(&self, _hosts: usize) -> Vec<String> {
        let mut problems = Vec::new();
        if !(1..=DISTRICTS_MAX).contains(&self.districts) {
            problems.push(format!("tpcc districts must be 1..={DISTRICTS_MAX}"));
        }
        if !(10..CUSTOMERS_MAX).contains(&self.customers_per_district) {
            problems.push(format!("tpcc customers_per_district must be 10..{CUSTOMERS_MAX}"));
        }
        if !(100..ITEMS_MAX).contains(&self.items) {
            problems.push(format!("tpcc items must be 100..{ITEMS_MAX}"));
        }
        if self.mix.iter().sum::<u32>() != 100 {
            problems.push("tpcc mix must sum to 100".into());
        }
        if self.remote_new_order_percent > 100 || self.remote_payment_percent > 100 {
            problems.push("tpcc remote percentages must be 0..=100".into());
        }
        problems
    }

    /// CUSTOMER and STOCK rows per warehouse: what other hosts may touch.
    pub fn shareable_rows_per_host(&self) -> u64 {
        self.districts * self.customers_per_district + self.items
    }
}

fn district_key(w: u64, d: u64) -> u64 {
    w * DISTRICTS_MAX + d
}
fn customer_key(w: u64, d: u64, c: u64) -> u64 {
    district_key(w, d) * CUSTOMERS_MAX + c
}
fn stock_key(w: u64, item: u64) -> u64 {
    (w << 20) | item
}
fn order_key(w: u64, d: u64, order: u64) -> u64 {
    (district_key(w, d) << 32) | order
}
fn order_line_key(w: u64, d: u64, order: u64, line: u64) -> u64 {
    (district_key(w, d) << 40) | (order << 4) | line
}
fn order_by_customer_key(w: u64, d: u64, c: u64, order: u64) -> u64 {
    (customer_key(w, d, c) << 28) | order
}
fn history_key(w: u64, id: u64) -> u64 {
    (w << 56) | id
}

/// Static data every host replicates: item prices and the customer last-name index.
struct Replicated {
    /// Price in cents of item i (index 0 unused).
    prices: Vec<u64>,
    /// (district key, last-name id) → customer ids sorted.
    by_last_name: HashMap<(u64, u64), Vec<u64>>,
}

pub struct Tpcc {
    config: TpccConfig,
    warehouses: usize,
    replicated: Arc<Replicated>,
}

/// TPC-C's last-name id of customer `c` (its syllables are not needed, only equality).
fn last_name_id(w: u64, d: u64, c: u64) -> u64 {
    if c <= 1000 {
        return c - 1;
    }
    let mut rng = SplitMix64::new(customer_key(w, d, c));
    nurand(&mut rng, 255, C_LAST, 0, 999)
}

impl Tpcc {
    pub fn new(config: TpccConfig, warehouses: usize) -> Tpcc {
        let mut rng = SplitMix64::new(0x7cc_1734);
        let prices = (0..=config.items).map(|_| rng.between(100, 10_000)).collect();
        let mut by_last_name: HashMap<(u64, u64), Vec<u64>> = HashMap::new();
        for w in 0..warehouses as u64 {
            for d in 0..config.districts {
                for c in 1..=config.customers_per_district {
                    by_last_name.entry((district_key(w, d), last_name_id(w, d, c))).or_default().push(c);
                }
            }
        }
        Tpcc { config, warehouses, replicated: Arc::new(Replicated { prices, by_last_name }) }
    }

    fn load_district(&self, w: u64, d: u64, rng: &mut SplitMix64, partition: &mut Partition) {
        let customers = self.config.customers_per_district;
        let mut row = vec![0u8; DISTRICT_BYTES];
        field::set_i64(&mut row, 0, 3_000_000);
        field::set_u64(&mut row, 8, rng.below(2000));
        field::set_u64(&mut row, 16, customers + 1);
        partition.table_mut(DISTRICT).insert(district_key(w, d), row.into_boxed_slice(), 0);
        for c in 1..=customers {
            let mut row = vec![(c % 251) as u8; CUSTOMER_BYTES];
            field::set_i64(&mut row, 0, -1000);
            field::set_u64(&mut row, 8, 1000);
            field::set_u64(&mut row, 16, 1);
            field::set_u64(&mut row, 24, 0);
            field::set_u64(&mut row, 32, rng.below(5000));
            field::set_u64(&mut row, 40, u64::from(rng.percent(10)));
            field::set_u64(&mut row, 48, last_name_id(w, d, c));
            partition.table_mut(CUSTOMER).insert(customer_key(w, d, c), row.into_boxed_slice(), 0);
            let mut history = vec![0u8; HISTORY_BYTES];
            field::set_u64(&mut history, 0, customer_key(w, d, c));
            field::set_i64(&mut history, 16, 1000);
            let id = district_key(w, d) * CUSTOMERS_MAX + c;
            partition.table_mut(HISTORY).insert(history_key(w, id), history.into_boxed_slice(), 0);
        }
        let mut permutation: Vec<u64> = (1..=customers).collect();
        for i in (1..permutation.len()).rev() {
            permutation.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let first_new = customers - customers * 3 / 10 + 1;
        for order in 1..=customers {
            self.load_order(w, d, order, permutation[order as usize - 1], order >= first_new, rng, partition);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn load_order(
        &self,
        w: u64,
        d: u64,
        order: u64,
        c: u64,
        new: bool,
        rng: &mut SplitMix64,
        partition: &mut Partition,
    ) {
        let lines = rng.between(5, 15);
        let mut row = vec![0u8; ORDER_BYTES];
        field::set_u64(&mut row, 0, c);
        field::set_u64(&mut row, 16, if new { 0 } else { rng.between(1, 10) });
        field::set_u64(&mut row, 24, lines);
        field::set_u64(&mut row, 32, 1);
        partition.table_mut(ORDER).insert(order_key(w, d, order), row.into_boxed_slice(), 0);
        let mut by_customer = vec![0u8; 8];
        field::set_u64(&mut by_customer, 0, order);
        partition.table_mut(ORDER_BY_CUSTOMER).insert(
            order_by_customer_key(w, d, c, order),
            by_customer.into_boxed_slice(),
            0,
        );
        if new {
            let mut row = vec![0u8; NEW_ORDER_BYTES];
            field::set_u64(&mut row, 0, order);
            partition.table_mut(NEW_ORDER).insert(order_key(w, d, order), row.into_boxed_slice(), 0);
        }
        for line in 1..=lines {
            let mut row = vec![0u8; ORDER_LINE_BYTES];
            field::set_u64(&mut row, 0, rng.between(1, self.config.items));
            field::set_u64(&mut row, 8, w);
            field::set_u64(&mut row, 16, 5);
            field::set_u64(&mut row, 24, if new { 0 } else { rng.between(1, 999_999) });
            partition.table_mut(ORDER_LINE).insert(order_line_key(w, d, order, line), row.into_boxed_slice(), 0);
        }
    }
}

impl Workload for Tpcc {
    fn name(&self) -> &'static str {
        "tpcc"
    }

    fn tables(&self) -> Vec<TableSpec> {
        let spec = |id, name, row_bytes, ordered| TableSpec { id, name, row_bytes, ordered };
        vec![
            spec(WAREHOUSE, "warehouse", WAREHOUSE_BYTES, false),
            spec(DISTRICT, "district", DISTRICT_BYTES, false),
            spec(CUSTOMER, "customer", CUSTOMER_BYTES, false),
            spec(HISTORY, "history", HISTORY_BYTES, false),
            spec(NEW_ORDER, "new_order", NEW_ORDER_BYTES, true),
            spec(ORDER, "order", ORDER_BYTES, true),
            spec(ORDER_LINE, "order_line", ORDER_LINE_BYTES, true),
            spec(STOCK, "stock", STOCK_BYTES, false),
            spec(ORDER_BY_CUSTOMER, "order_by_customer", 8, true),
        ]
    }

    fn owner(&self, table: TableId, key: u64) -> usize {
        let warehouse = match table {
            WAREHOUSE => key,
            DISTRICT => key / DISTRICTS_MAX,
            CUSTOMER => key / (DISTRICTS_MAX * CUSTOMERS_MAX),
            HISTORY => key >> 56,
            NEW_ORDER | ORDER => (key >> 32) / DISTRICTS_MAX,
            ORDER_LINE => (key >> 40) / DISTRICTS_MAX,
            STOCK => key >> 20,
            _ => (key >> 28) / (DISTRICTS_MAX * CUSTOMERS_MAX),
        };
        (warehouse as usize).min(self.warehouses - 1)
    }

    fn load(&self, host: usize, partition: &mut Partition) {
        let w = host as u64;
        let mut rng = SplitMix64::new(0x10ad ^ w.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut row = vec![0u8; WAREHOUSE_BYTES];
        field::set_i64(&mut row, 0, 3_000_000 * self.config.districts as i64);
        field::set_u64(&mut row, 8, rng.below(2000));
        partition.table_mut(WAREHOUSE).insert(w, row.into_boxed_slice(), 0);
        for item in 1..=self.config.items {
            let mut row = vec![(item % 251) as u8; STOCK_BYTES];
            field::set_u64(&mut row, 0, rng.between(10, 100));
            for offset in [8, 16, 24] {
                field::set_u64(&mut row, offset, 0);
            }
            partition.table_mut(STOCK).insert(stock_key(w, item), row.into_boxed_slice(), 0);
        }
        for d in 0..self.config.districts {
            self.load_district(w, d, &mut rng, partition);
        }
    }

    fn driver(&self, host: usize, seed: u64, id_base: u64) -> Box<dyn Driver> {
        Box::new(TpccDriver {
            config: self.config.clone(),
            replicated: Arc::clone(&self.replicated),
            warehouses: self.warehouses as u64,
            w: host as u64,
            rng: SplitMix64::new(seed),
            history_id: id_base,
            plan: Plan::Delivery { carrier: 1 },
        })
    }

    fn shareable_tables(&self) -> Vec<TableId> {
        vec![CUSTOMER, STOCK]
    }
    fn check(&self, host: usize, partition: &Partition) -> Check {
        check_consistency(&self.config, host as u64, partition)
    }
}

/// TPC-C consistency conditions 1–4 on warehouse `w`.
fn check_consistency(config: &TpccConfig, w: u64, partition: &Partition) -> Check {
    let mut failures = Vec::new();
    let row =
        |table: TableId, key: u64| partition.table(table).find(key).map(|id| &partition.table(table).row(id).data);
    let Some(warehouse) = row(WAREHOUSE, w) else {
        return Check { failures: vec![format!("warehouse {w} missing")], ..Check::default() };
    };
    let mut district_ytd = 0i64;
    let mut orders = 0u64;
    for d in 0..config.districts {
        let Some(district) = row(DISTRICT, district_key(w, d)) else {
            failures.push(format!("district {w}/{d} missing"));
            continue;
        };
        district_ytd += field::i64_at(district, 0);
        let next_order = field::u64_at(district, 16);
        let order_ids: Vec<u64> = partition
            .table(ORDER)
            .range(order_key(w, d, 0), order_key(w, d, u32::MAX as u64), usize::MAX)
            .iter()
            .map(|(key, _)| key & 0xFFFF_FFFF)
            .collect();
        let new_orders: Vec<u64> = partition
            .table(NEW_ORDER)
            .range(order_key(w, d, 0), order_key(w, d, u32::MAX as u64), usize::MAX)
            .iter()
            .map(|(key, _)| key & 0xFFFF_FFFF)
            .collect();
        orders += order_ids.len() as u64;
        let max_order = order_ids.last().copied().unwrap_or(0);
        if next_order - 1 != max_order || new_orders.last().is_some_and(|&max| max != max_order) {
            failures.push(format!(
                "condition 2, district {w}/{d}: next {next_order}, max order {max_order}, max new order {:?}",
                new_orders.last()
            ));
        }
        if let (Some(first), Some(last)) = (new_orders.first(), new_orders.last()) {
            if new_orders.len() as u64 != last - first + 1 {
                failures.push(format!(
                    "condition 3, district {w}/{d}: {} new orders in {first}..={last}",
                    new_orders.len()
                ));
            }
        }
        let line_count: u64 = partition
            .table(ORDER)
            .range(order_key(w, d, 0), order_key(w, d, u32::MAX as u64), usize::MAX)
            .iter()
            .map(|(_, id)| field::u64_at(&partition.table(ORDER).row(*id).data, 24))
            .sum();
        let lines = partition
            .table(ORDER_LINE)
            .range(order_line_key(w, d, 0, 0), order_line_key(w, d, (1 << 36) - 1, 15), usize::MAX)
            .len() as u64;
        if line_count != lines {
            failures.push(format!("condition 4, district {w}/{d}: Σ o_ol_cnt {line_count} vs {lines} order lines"));
        }
    }
    if field::i64_at(warehouse, 0) != district_ytd {
        failures.push(format!(
            "condition 1, warehouse {w}: w_ytd {} vs Σ d_ytd {district_ytd}",
            field::i64_at(warehouse, 0)
        ));
    }
    Check { failures, value_a: orders, value_b: field::i64_at(warehouse, 0) as u64 }
}

enum Customer {
    Id(u64),
    LastName(u64),
}

enum Plan {
    NewOrder { d: u64, c: u64, lines: Vec<(u64, u64, u64)>, rollback: bool },
    Payment { d: u64, customer_w: u64, customer_d: u64, customer: Customer, amount: i64 },
    OrderStatus { d: u64, customer: Customer },
    Delivery { carrier: u64 },
    StockLevel { d: u64, threshold: u64 },
}

struct TpccDriver {
    config: TpccConfig,
    replicated: Arc<Replicated>,
    warehouses: u64,
    w: u64,
    rng: SplitMix64,
    history_id: u64,
    plan: Plan,
}

fn missing(what: &str) -> TxnError {
    TxnError::Fatal(PodError::Workload(format!("tpcc: {what} missing")))
}

impl TpccDriver {
    fn other_warehouse(&mut self) -> u64 {
        (self.w + 1 + self.rng.below(self.warehouses - 1)) % self.warehouses
    }

    fn pick_customer(&mut self) -> Customer {
        let c = nurand(&mut self.rng, 1023, C_CUSTOMER, 1, self.config.customers_per_district);
        if self.rng.percent(60) {
            Customer::LastName(c)
        } else {
            Customer::Id(c)
        }
    }

    /// A customer id: by id, or the middle one of those sharing the last name of customer `c`.
    fn resolve(&self, w: u64, d: u64, customer: &Customer) -> u64 {
        match *customer {
            Customer::Id(c) => c,
            Customer::LastName(c) => {
                let same = &self.replicated.by_last_name[&(district_key(w, d), last_name_id(w, d, c))];
                same[same.len().div_ceil(2) - 1]
            }
        }
    }

    fn plan_new_order(&mut self) -> Plan {
        let d = self.rng.below(self.config.districts);
        let c = nurand(&mut self.rng, 1023, C_CUSTOMER, 1, self.config.customers_per_district);
        let count = self.rng.between(5, 15);
        let remote = self.warehouses > 1 && self.rng.percent(self.config.remote_new_order_percent);
        let mut lines = Vec::with_capacity(count as usize);
        while lines.len() < count as usize {
            let item = nurand(&mut self.rng, 8191, C_ITEM, 1, self.config.items);
            if lines.iter().any(|(seen, _, _)| *seen == item) {
                continue;
            }
            let supply = if remote && lines.is_empty() { self.other_warehouse() } else { self.w };
            lines.push((item, supply, self.rng.between(1, 10)));
        }
        Plan::NewOrder { d, c, lines, rollback: self.rng.percent(1) }
    }

    fn plan_payment(&mut self) -> Plan {
        let d = self.rng.below(self.config.districts);
        let remote = self.warehouses > 1 && self.rng.percent(self.config.remote_payment_percent);
        let (customer_w, customer_d) =
            if remote { (self.other_warehouse(), self.rng.below(self.config.districts)) } else { (self.w, d) };
        Plan::Payment {
            d,
            customer_w,
            customer_d,
            customer: self.pick_customer(),
            amount: self.rng.between(100, 500_000) as i64,
        }
    }

    fn new_order(
        &self,
        txn: &mut dyn TxnOps,
        d: u64,
        c: u64,
        lines: &[(u64, u64, u64)],
        rollback: bool,
    ) -> TxnResult<()> {
        let w = self.w;
        // Tigon's first phase: warehouse, district, customer and every stock row at once.
        let mut wanted = vec![
            Fetch::read(WAREHOUSE, w),
            Fetch::write(DISTRICT, district_key(w, d)),
            Fetch::read(CUSTOMER, customer_key(w, d, c)),
        ];
        wanted.extend(lines.iter().map(|&(item, supply, _)| Fetch::write(STOCK, stock_key(supply, item))));
        txn.fetch(&wanted)?;
        let w_tax = field::u64_at(txn.read(WAREHOUSE, w)?.ok_or_else(|| missing("warehouse"))?, 8);
        let mut district =
            txn.read_for_update(DISTRICT, district_key(w, d))?.ok_or_else(|| missing("district"))?.to_vec();
        let (d_tax, order) = (field::u64_at(&district, 8), field::u64_at(&district, 16));
        field::set_u64(&mut district, 16, order + 1);
        txn.write(DISTRICT, district_key(w, d), &district)?;
        let discount =
            field::u64_at(txn.read(CUSTOMER, customer_key(w, d, c))?.ok_or_else(|| missing("customer"))?, 32);
        let mut row = vec![0u8; ORDER_BYTES];
        field::set_u64(&mut row, 0, c);
        field::set_u64(&mut row, 24, lines.len() as u64);
        field::set_u64(&mut row, 32, u64::from(lines.iter().all(|(_, supply, _)| *supply == w)));
        txn.insert(ORDER, order_key(w, d, order), &row)?;
        txn.insert(NEW_ORDER, order_key(w, d, order), &order.to_le_bytes())?;
        txn.insert(ORDER_BY_CUSTOMER, order_by_customer_key(w, d, c, order), &order.to_le_bytes())?;
        for (number, &(item, supply, quantity)) in lines.iter().enumerate() {
            if rollback && number + 1 == lines.len() {
                return abort(Abort::User); // TPC-C: 1% of NewOrders name an unused item and roll back
            }
            let price = self.replicated.prices[item as usize];
            update(txn, STOCK, stock_key(supply, item), |stock| {
                let on_hand = field::u64_at(stock, 0);
                field::set_u64(
                    stock,
                    0,
                    if on_hand >= quantity + 10 { on_hand - quantity } else { on_hand + 91 - quantity },
                );
                field::set_u64(stock, 8, field::u64_at(stock, 8) + quantity);
                field::set_u64(stock, 16, field::u64_at(stock, 16) + 1);
                field::set_u64(stock, 24, field::u64_at(stock, 24) + u64::from(supply != w));
            })?;
            let amount = quantity * price * (10_000 + w_tax + d_tax) / 10_000 * (10_000 - discount) / 10_000;
            let mut line = vec![0u8; ORDER_LINE_BYTES];
            field::set_u64(&mut line, 0, item);
            field::set_u64(&mut line, 8, supply);
            field::set_u64(&mut line, 16, quantity);
            field::set_u64(&mut line, 24, amount);
            txn.insert(ORDER_LINE, order_line_key(w, d, order, number as u64 + 1), &line)?;
        }
        Ok(())
    }

    fn payment(
        &mut self,
        txn: &mut dyn TxnOps,
        d: u64,
        customer_w: u64,
        customer_d: u64,
        customer: u64,
        amount: i64,
    ) -> TxnResult<()> {
        let w = self.w;
        let customer_key = customer_key(customer_w, customer_d, customer);
        // One phase (Tigon's Payment by id; by name its index lookup is replicated here).
        txn.fetch(&[
            Fetch::write(WAREHOUSE, w),
            Fetch::write(DISTRICT, district_key(w, d)),
            Fetch::write(CUSTOMER, customer_key),
        ])?;
        let add_ytd = |row: &mut [u8]| field::set_i64(row, 0, field::i64_at(row, 0) + amount);
        update(txn, WAREHOUSE, w, add_ytd)?.then_some(()).ok_or_else(|| missing("warehouse"))?;
        update(txn, DISTRICT, district_key(w, d), add_ytd)?.then_some(()).ok_or_else(|| missing("district"))?;
        let paid = update(txn, CUSTOMER, customer_key, |row| {
            field::set_i64(row, 0, field::i64_at(row, 0) - amount);
            field::set_u64(row, 8, field::u64_at(row, 8) + amount as u64);
            field::set_u64(row, 16, field::u64_at(row, 16) + 1);
            if field::u64_at(row, 40) == 1 {
                row[56..64].copy_from_slice(&amount.to_le_bytes()); // bad credit: C_DATA records the payment
            }
        })?;
        paid.then_some(()).ok_or_else(|| missing("customer"))?;
        self.history_id += 1;
        let mut history = vec![0u8; HISTORY_BYTES];
        field::set_u64(&mut history, 0, customer_key);
        field::set_u64(&mut history, 8, district_key(w, d));
        field::set_i64(&mut history, 16, amount);
        txn.insert(HISTORY, history_key(w, self.history_id), &history)
    }

    fn order_status(&self, txn: &mut dyn TxnOps, d: u64, c: u64) -> TxnResult<()> {
        let w = self.w;
        txn.read(CUSTOMER, customer_key(w, d, c))?.ok_or_else(|| missing("customer"))?;
        let orders = txn.scan(
            ORDER_BY_CUSTOMER,
            order_by_customer_key(w, d, c, 0),
            order_by_customer_key(w, d, c, ORDER_ID_MASK),
            1024,
        )?;
        let Some(last) = orders.last() else { return Ok(()) };
        let order = last & ORDER_ID_MASK;
        txn.read(ORDER, order_key(w, d, order))?.ok_or_else(|| missing("order"))?;
        for line in txn.scan(ORDER_LINE, order_line_key(w, d, order, 0), order_line_key(w, d, order, 15), 16)? {
            txn.read(ORDER_LINE, line)?;
        }
        Ok(())
    }

    fn delivery(&self, txn: &mut dyn TxnOps, carrier: u64) -> TxnResult<()> {
        let w = self.w;
        for d in 0..self.config.districts {
            let oldest = txn.scan(NEW_ORDER, order_key(w, d, 0), order_key(w, d, u32::MAX as u64), 1)?;
            let Some(&new_order) = oldest.first() else { continue };
            let order = new_order & 0xFFFF_FFFF;
            txn.delete(NEW_ORDER, new_order)?;
            let mut row = txn.read_for_update(ORDER, order_key(w, d, order))?.ok_or_else(|| missing("order"))?.to_vec();
            let c = field::u64_at(&row, 0);
            field::set_u64(&mut row, 16, carrier);
            txn.write(ORDER, order_key(w, d, order), &row)?;
            let mut total = 0u64;
            for line in txn.scan(ORDER_LINE, order_line_key(w, d, order, 0), order_line_key(w, d, order, 15), 16)? {
                update(txn, ORDER_LINE, line, |row| {
                    total += field::u64_at(row, 24);
                    field::set_u64(row, 32, carrier);
                })?;
            }
            update(txn, CUSTOMER, customer_key(w, d, c), |row| {
                field::set_i64(row, 0, field::i64_at(row, 0) + total as i64);
                field::set_u64(row, 24, field::u64_at(row, 24) + 1);
            })?;
        }
        Ok(())
    }

    fn stock_level(&self, txn: &mut dyn TxnOps, d: u64, threshold: u64) -> TxnResult<()> {
        let w = self.w;
        let next = field::u64_at(txn.read(DISTRICT, district_key(w, d))?.ok_or_else(|| missing("district"))?, 16);
        let first = next.saturating_sub(20).max(1);
        let lines = txn.scan(ORDER_LINE, order_line_key(w, d, first, 0), order_line_key(w, d, next - 1, 15), 400)?;
        let mut items = Vec::with_capacity(lines.len());
        for line in lines {
            if let Some(row) = txn.read(ORDER_LINE, line)? {
                items.push(field::u64_at(row, 0));
            }
        }
        items.sort_unstable();
        items.dedup();
        let mut low = 0;
        for item in items {
            if txn.read(STOCK, stock_key(w, item))?.is_some_and(|row| field::u64_at(row, 0) < threshold) {
                low += 1;
            }
        }
        std::hint::black_box(low);
        Ok(())
    }
}

impl Driver for TpccDriver {
    fn next_transaction(&mut self) {
        let roll = self.rng.below(100) as u32;
        let mix = self.config.mix;
        self.plan = if roll < mix[0] {
            self.plan_new_order()
        } else if roll < mix[0] + mix[1] {
            self.plan_payment()
        } else if roll < mix[0] + mix[1] + mix[2] {
            Plan::OrderStatus { d: self.rng.below(self.config.districts), customer: self.pick_customer() }
        } else if roll < mix[0] + mix[1] + mix[2] + mix[3] {
            Plan::Delivery { carrier: self.rng.between(1, 10) }
        } else {
            Plan::StockLevel { d: self.rng.below(self.config.districts), threshold: self.rng.between(10, 20) }
        };
    }

    fn execute(&mut self, txn: &mut dyn TxnOps) -> TxnResult<()> {
        match &self.plan {
            Plan::NewOrder { d, c, lines, rollback } => self.new_order(txn, *d, *c, &lines.clone(), *rollback),
            Plan::Payment { d, customer_w, customer_d, customer, amount } => {
                let (d, customer_w, customer_d, amount) = (*d, *customer_w, *customer_d, *amount);
                let c = self.resolve(customer_w, customer_d, customer);
                self.payment(txn, d, customer_w, customer_d, c, amount)
            }
            Plan::OrderStatus { d, customer } => self.order_status(txn, *d, self.resolve(self.w, *d, customer)),
            Plan::Delivery { carrier } => self.delivery(txn, *carrier),
            Plan::StockLevel { d, threshold } => self.stock_level(txn, *d, *threshold),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded() -> (TpccConfig, Partition) {
        let config = TpccConfig { districts: 2, customers_per_district: 30, items: 200, ..TpccConfig::small(0, 0) };
        let tpcc = Tpcc::new(config.clone(), 2);
        let mut partition = Partition::new(&tpcc.tables());
        tpcc.load(1, &mut partition);
        (config, partition)
    }

    #[test]
    fn freshly_loaded_warehouse_is_consistent() {
        // Goal: the loader satisfies conditions 1–4. Method: load warehouse 1, check.
        let (config, partition) = loaded();
        let check = check_consistency(&config, 1, &partition);
        assert!(check.failures.is_empty(), "{:?}", check.failures);
        assert_eq!(check.value_a, 60, "one order per customer");
    }

    #[test]
    fn each_condition_detects_its_violation() {
        // Goal: the checker is not vacuous. Method: break each condition in a fresh warehouse.
        let (config, mut partition) = loaded();
        let w_row = partition.table(WAREHOUSE).find(1).expect("warehouse");
        field::set_i64(&mut partition.table_mut(WAREHOUSE).row_mut(w_row).data, 0, 1);
        let middle = order_key(1, 0, 25);
        partition.table_mut(NEW_ORDER).remove(middle);
        let line = order_line_key(1, 1, 3, 1);
        partition.table_mut(ORDER_LINE).remove(line);
        let district = partition.table(DISTRICT).find(district_key(1, 1)).expect("district");
        field::set_u64(&mut partition.table_mut(DISTRICT).row_mut(district).data, 16, 99);
        let failures = check_consistency(&config, 1, &partition).failures;
        for condition in ["condition 1", "condition 2", "condition 3", "condition 4"] {
            assert!(
                failures.iter().any(|failure| failure.starts_with(condition)),
                "{condition} not detected: {failures:?}"
            );
        }
    }

    #[test]
    fn keys_map_to_their_warehouse() {
        // Goal: partitioning by warehouse for every table. Method: a key of each table for warehouse 1.
        let tpcc = Tpcc::new(TpccConfig::small(0, 0), 3);
        let keys = [
            (WAREHOUSE, 1),
            (DISTRICT, district_key(1, 9)),
            (CUSTOMER, customer_key(1, 9, 3000)),
            (HISTORY, history_key(1, 1 << 40)),
            (NEW_ORDER, order_key(1, 9, 7)),
            (ORDER, order_key(1, 9, 7)),
            (ORDER_LINE, order_line_key(1, 9, 7, 15)),
            (STOCK, stock_key(1, 99_999)),
            (ORDER_BY_CUSTOMER, order_by_customer_key(1, 9, 3000, 7)),
        ];
        for (table, key) in keys {
            assert_eq!(tpcc.owner(table, key), 1, "table {table}");
        }
    }
}
