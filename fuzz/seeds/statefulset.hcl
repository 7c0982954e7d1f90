statefulset "data" "pg" {
  image    = "postgres:16"
  replicas = 1
  env      = { PGDATA = "${PGDATA:-/var/lib/postgresql/data}" }
  ports    = ["5432"]

  volume_claim "data" {
    mount_path = "/var/lib/postgresql/data"
    size       = "10Gi"
  }

  probes {
    readiness {
      exec {
        command = ["pg_isready", "-U", "postgres"]
      }
      period            = "5s"
      failure_threshold = 3
    }
    liveness {
      tcp_socket {
        port = 5432
      }
    }
    startup {
      http_get {
        path   = "/ready"
        port   = 8080
        scheme = "http"
        http_headers = { X-Probe = "1" }
      }
    }
  }
}
