// Replays DBeaver's metadata queries (queries.sql) through pgjdbc, as DBeaver sends them:
// prepared statements with typed parameters, every column read with getObject and described by
// ResultSetMetaData. Prints each answer for tests/clients.rs to check:
//   == <label>
//   columns: <name>:<type name>,...
//   origins: <table name>:<nullable>,...  (ResultSetMetaData.getTableName and isNullable,
//            which pgjdbc answers from RowDescription's table oid and column number)
//   row: <name>=<value>|...
//   error: <SQLSTATE> <message>      (instead of columns and rows)
// Usage: java -cp <dir>:postgresql.jar DbeaverReplay <queries.sql> <jdbc url> <user> <password>

import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Array;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

public class DbeaverReplay {
    /** One block of queries.sql: its label, parameters and SQL. */
    record Query(String label, List<String> parameters, String sql) {}

    public static void main(String[] args) throws Exception {
        List<Query> queries = parse(Files.readAllLines(Path.of(args[0])));
        // Oids DBeaver takes from earlier answers: schema "public" and table "items".
        Map<String, String> found = new HashMap<>();
        try (Connection connection = DriverManager.getConnection(args[1], args[2], args[3])) {
            for (Query query : queries) {
                System.out.println("== " + query.label());
                try (PreparedStatement statement = connection.prepareStatement(query.sql())) {
                    bind(statement, query.parameters(), found);
                    try (ResultSet rows = statement.executeQuery()) {
                        print(rows, found);
                    }
                } catch (SQLException e) {
                    System.out.println("error: " + e.getSQLState() + " " + e.getMessage().replace('\n', ' '));
                }
            }
        }
    }

    static List<Query> parse(List<String> lines) {
        List<Query> queries = new ArrayList<>();
        String header = null;
        StringBuilder sql = new StringBuilder();
        for (String line : lines) {
            if (line.startsWith("-- query: ")) {
                if (header != null) {
                    queries.add(query(header, sql));
                }
                header = line.substring("-- query: ".length());
                sql.setLength(0);
            } else if (header != null) {
                sql.append(sql.length() == 0 ? "" : "\n").append(line);
            }
        }
        if (header != null) {
            queries.add(query(header, sql));
        }
        return queries;
    }

    static Query query(String header, StringBuilder sql) {
        List<String> words = new ArrayList<>(Arrays.asList(header.split(" ")));
        List<String> parameters = new ArrayList<>();
        while (!words.isEmpty() && words.get(words.size() - 1).matches("(text|long):.*")) {
            parameters.add(0, words.remove(words.size() - 1));
        }
        return new Query(String.join(" ", words), parameters, sql.toString());
    }

    static void bind(PreparedStatement statement, List<String> parameters, Map<String, String> found)
            throws SQLException {
        for (int i = 0; i < parameters.size(); i++) {
            String[] parameter = parameters.get(i).split(":", 2);
            String value = parameter[1].startsWith("$") ? found.get(parameter[1].substring(1)) : parameter[1];
            if (value == null) {
                throw new SQLException("no " + parameter[1] + " read yet", "XXTST");
            }
            if (parameter[0].equals("long")) {
                statement.setLong(i + 1, Long.parseLong(value));
            } else {
                statement.setString(i + 1, value);
            }
        }
    }

    static void print(ResultSet rows, Map<String, String> found) throws SQLException {
        ResultSetMetaData meta = rows.getMetaData();
        List<String> columns = new ArrayList<>();
        for (int i = 1; i <= meta.getColumnCount(); i++) {
            columns.add(meta.getColumnLabel(i) + ":" + meta.getColumnTypeName(i));
        }
        System.out.println("columns: " + String.join(",", columns));
        List<String> origins = new ArrayList<>();
        for (int i = 1; i <= meta.getColumnCount(); i++) {
            origins.add(meta.getTableName(i) + ":" + meta.isNullable(i));
        }
        System.out.println("origins: " + String.join(",", origins));
        while (rows.next()) {
            Map<String, String> row = new HashMap<>();
            List<String> cells = new ArrayList<>();
            for (int i = 1; i <= meta.getColumnCount(); i++) {
                String value = text(rows.getObject(i));
                row.put(meta.getColumnLabel(i), value);
                cells.add(meta.getColumnLabel(i) + "=" + value);
            }
            System.out.println("row: " + String.join("|", cells));
            if ("public".equals(row.get("nspname")) && row.containsKey("oid")) {
                found.put("schema", row.get("oid"));
            }
            if ("items".equals(row.get("relname")) && row.containsKey("relkind") && row.containsKey("oid")) {
                found.put("table", row.get("oid"));
            }
        }
    }

    static String text(Object value) throws SQLException {
        if (value instanceof Array array) {
            return Arrays.deepToString((Object[]) array.getArray());
        }
        return String.valueOf(value).replace('\n', ' ').replace('|', '/');
    }
}
