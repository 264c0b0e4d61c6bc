#!/usr/bin/env bash
# Install the JDBC drivers the Spark reconciler uses, from Debian's packages, and say where they are.
#
# usage: scripts/jdbc.sh [install|jars|check]   (default: install)
#
#   install  apt-get install libmariadb-java libxerial-sqlite-jdbc-java libpostgresql-jdbc-java
#            (apt-get update only when needed) and print the resolved jar paths, one per line
#   jars     print the resolved jar paths as ONE comma-separated line on stdout (for spark.jars /
#            CKIT_JDBC_JARS); installs the packages first when they are missing
#   check    open an in-memory SQLite connection (and MariaDB ckit_test when it is up) through the
#            drivers with `java`, to prove the jars and sqlite's JNI library load; load pgJDBC
#
# All messages go to stderr; stdout carries only the paths.
set -euo pipefail

readonly PACKAGES=(libmariadb-java libxerial-sqlite-jdbc-java libpostgresql-jdbc-java)
readonly JAVA_DIR=/usr/share/java
# First existing name wins for each driver; symlinks are resolved to the real file.
readonly MARIADB_NAMES=(mariadb-java-client.jar)
readonly SQLITE_NAMES=(sqlite-jdbc.jar xerial-sqlite-jdbc.jar)
readonly POSTGRES_NAMES=(postgresql.jar)

LOG_TAG=jdbc
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# resolve NAME... : print the real path of the first NAME present in JAVA_DIR.
resolve() {
  local name
  for name in "$@"; do
    if [[ -e ${JAVA_DIR}/${name} ]]; then
      readlink -f "${JAVA_DIR}/${name}"
      return 0
    fi
  done
  die "none of $* found in ${JAVA_DIR}"
}

jar_paths() {
  resolve "${MARIADB_NAMES[@]}"
  resolve "${SQLITE_NAMES[@]}"
  resolve "${POSTGRES_NAMES[@]}"
}

cmd_install() {
  apt_install "${PACKAGES[@]}"
  jar_paths
}

cmd_jars() {
  apt_install "${PACKAGES[@]}"
  local paths
  paths=$(jar_paths)
  paste -sd, <<<"$paths"
}

cmd_check() {
  command -v java >/dev/null || die "java is not on PATH"
  apt_install "${PACKAGES[@]}"
  local tmp classpath
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064  # expand $tmp now
  trap "rm -rf '$tmp'" EXIT
  classpath=$(jar_paths | paste -sd:)
  cat >"${tmp}/JdbcCheck.java" <<'EOF'
import java.net.Socket;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;

public class JdbcCheck {
  static String one(Connection c, String sql) throws Exception {
    try (ResultSet r = c.createStatement().executeQuery(sql)) {
      r.next();
      return r.getString(1);
    }
  }

  public static void main(String[] args) throws Exception {
    try (Connection c = DriverManager.getConnection("jdbc:sqlite::memory:")) {
      System.err.println("[jdbc] sqlite driver ok: SQLite " + one(c, "select sqlite_version()"));
    }
    Class.forName("org.postgresql.Driver");
    System.err.println("[jdbc] postgresql driver loads");
    Class.forName("org.mariadb.jdbc.Driver");
    try (Socket s = new Socket("127.0.0.1", 3306)) {
      // a server is listening: try the test account too
    } catch (java.io.IOException e) {
      System.err.println("[jdbc] mariadb driver loads (no server on 127.0.0.1:3306 to try)");
      return;
    }
    String url = "jdbc:mariadb://127.0.0.1:3306/ckit_test";
    try (Connection c = DriverManager.getConnection(url, "ckit", "ckit")) {
      System.err.println("[jdbc] mariadb driver ok: " + one(c, "select version()"));
    }
  }
}
EOF
  java -cp "$classpath" "${tmp}/JdbcCheck.java" || die "JDBC check failed"
}

main() {
  case ${1:-install} in
    install) cmd_install ;;
    jars) cmd_jars ;;
    check) cmd_check ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

main "$@"
