-- The SQL DBeaver's PostgreSQL driver (plugins/org.jkiss.dbeaver.ext.postgresql, dbeaver/dbeaver
-- at 2428359b74) sends when it connects to a PostgreSQL 15 server and browses a database: the
-- texts are DBeaver's, with its default settings (no template or unavailable databases, data
-- types read base and composite only), all sent as prepared statements as DBeaver does.
-- Each block starts with `-- query: <label>` and its parameters: `text:<value>`, or `long:$schema`
-- / `long:$table` for the oid of schema "public" / table "items" read from an earlier answer
-- (as DBeaver takes them from its caches). Replayed by DbeaverReplay.java (tests/clients.rs).
-- query: version
SELECT version()
-- query: enum table check (PostgreDataSource.initialize)
SELECT * FROM pg_catalog.pg_enum WHERE 1<>1 LIMIT 1
-- query: reltype column check (PostgreDataSource.initialize)
SELECT reltype FROM pg_catalog.pg_class WHERE 1<>1 LIMIT 1
-- query: databases (PostgreDataSource.prepareReadDatabaseListStatement) text:bypass
SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE 1 = 1 AND datallowconn AND NOT datistemplate OR db.datname =?
ORDER BY db.datname
-- query: current database
SELECT current_database()
-- query: setting (PostgreDataSource.SettingCache) text:standard_conforming_strings
select * from pg_catalog.pg_settings where name=?
-- query: database info (PostgreDatabase.readDatabaseInfo) text:bypass
SELECT db.oid,db.* FROM pg_catalog.pg_database db WHERE datname=?
-- query: context defaults (PostgreExecutionContext.refreshDefaults)
SELECT current_schema(),session_user
-- query: schemas (PostgreDatabase.SchemaCache)
SELECT n.oid,n.*,d.description FROM pg_catalog.pg_namespace n
LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=n.oid AND d.objsubid=0 AND d.classoid='pg_namespace'::regclass
 ORDER BY nspname
-- query: search path
SHOW search_path
-- query: data types (PostgreDatabase.cacheDataTypes)
SELECT t.oid,t.*,c.relkind,format_type(nullif(t.typbasetype, 0), t.typtypmod) as base_type_name, d.description
FROM pg_catalog.pg_type t
LEFT OUTER JOIN pg_catalog.pg_type et ON et.oid=t.typelem 
LEFT OUTER JOIN pg_catalog.pg_class c ON c.oid=t.typrelid
LEFT OUTER JOIN pg_catalog.pg_description d ON t.oid=d.objoid
WHERE t.typname IS NOT NULL
AND (c.relkind IS NULL OR c.relkind = 'c') AND (et.typcategory IS NULL OR et.typcategory <> 'C')
-- query: roles (PostgreDatabase.RoleCache)
SELECT a.oid,a.*,pd.description FROM pg_catalog.pg_roles a 
left join pg_catalog.pg_shdescription pd on a.oid = pd.objoid
ORDER BY a.rolname
-- query: access methods (PostgreDatabase.AccessMethodCache)
SELECT am.oid,am.* FROM pg_catalog.pg_am am 
ORDER BY am.oid
-- query: database description (PostgreDatabase.getDescription) text:bypass
select description from pg_shdescription join pg_database on objoid = pg_database.oid where datname = ?
-- query: tables (PostgreSchema.TableCache) long:$schema
SELECT c.oid,c.*,d.description,pg_catalog.pg_get_expr(c.relpartbound, c.oid) as partition_expr,  pg_catalog.pg_get_partkeydef(c.oid) as partition_key 
FROM pg_catalog.pg_class c
LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 AND d.classoid='pg_class'::regclass
WHERE c.relnamespace=? AND c.relkind not in ('i','I','c')
-- query: table statistics (PostgreSchema.collectObjectStatistics) long:$schema
select c.oid,pg_catalog.pg_total_relation_size(c.oid) as total_rel_size,pg_catalog.pg_relation_size(c.oid) as rel_size
FROM pg_class c
WHERE c.relnamespace=?
-- query: inheritance (PostgreSchema.getTableInheritance) long:$schema
SELECT i.inhrelid relid, pc.relnamespace parent_ns, pc.oid parent_oid, i.inhseqno
FROM pg_catalog.pg_inherits i, pg_class rc, pg_class pc
WHERE rc.oid=i.inhrelid AND rc.relnamespace=? AND pc.oid=i.inhparent
-- query: columns (PostgreSchema.TableCache children) long:$table
SELECT c.relname,a.*,pg_catalog.pg_get_expr(ad.adbin, ad.adrelid, true) as def_value,dsc.description,dep.objid
FROM pg_catalog.pg_attribute a
INNER JOIN pg_catalog.pg_class c ON (a.attrelid=c.oid)
LEFT OUTER JOIN pg_catalog.pg_attrdef ad ON (a.attrelid=ad.adrelid AND a.attnum = ad.adnum)
LEFT OUTER JOIN pg_catalog.pg_description dsc ON (c.oid=dsc.objoid AND a.attnum = dsc.objsubid)
LEFT OUTER JOIN pg_depend dep on dep.refobjid = a.attrelid AND dep.deptype = 'i' and dep.refobjsubid = a.attnum and dep.classid = dep.refclassid
WHERE NOT a.attisdropped AND c.relkind not in ('i','I','c') AND c.oid=?
ORDER BY a.attnum
-- query: constraints (PostgreSchema.ConstraintCache) long:$table
SELECT c.oid,c.*,t.relname as tabrelname,rt.relnamespace as refnamespace,d.description, case when c.contype='c' then "substring"(pg_get_constraintdef(c.oid), 7) else null end consrc_copy
FROM pg_catalog.pg_constraint c
INNER JOIN pg_catalog.pg_class t ON t.oid=c.conrelid
LEFT OUTER JOIN pg_catalog.pg_class rt ON rt.oid=c.confrelid
LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=c.oid AND d.objsubid=0 AND d.classoid='pg_constraint'::regclass
WHERE c.conrelid=?
ORDER BY c.oid
-- query: indexes (PostgreSchema.IndexCache) long:$table
SELECT i.*,i.indkey as keys,c.relname,c.relnamespace,c.relam,c.reltablespace,tc.relname as tabrelname,dsc.description,pg_catalog.pg_get_expr(i.indpred, i.indrelid) as pred_expr,pg_catalog.pg_get_expr(i.indexprs, i.indrelid, true) as expr,pg_catalog.pg_relation_size(i.indexrelid) as index_rel_size,pg_catalog.pg_stat_get_numscans(i.indexrelid) as index_num_scans
FROM pg_catalog.pg_index i
INNER JOIN pg_catalog.pg_class c ON c.oid=i.indexrelid
INNER JOIN pg_catalog.pg_class tc ON tc.oid=i.indrelid
LEFT OUTER JOIN pg_catalog.pg_description dsc ON i.indexrelid=dsc.objoid
WHERE  i.indrelid=? ORDER BY c.relname
-- query: row count (the data editor's row count)
SELECT COUNT(*) FROM public.items
-- query: data (the data editor's first page)
SELECT * FROM public.items
LIMIT 200
-- query: result origins (not DBeaver's: what pgjdbc's ResultSetMetaData says of a join and a computed column)
SELECT i.name, i.qty * 2 AS twice, j.code FROM public.items i JOIN public.items j ON i.id = j.id ORDER BY i.id
