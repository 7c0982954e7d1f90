deployment "shop" "web" {
  image    = "nginx:${TAG:-1.27}"
  command  = ["nginx", "-g", "daemon off;", 80]
  replicas = "2"
  env      = { PORT = "${PORT:-80}", DEBUG = true, RATIO = 1.5 }
  env_from = ["shop", "shop/web"]
  ports    = ["8080:80", "127.0.0.1:9000:9000/udp"]
  restart  = "on-failure:3"
  health_check = "/healthz"
  volumes  = ["/srv/data:/data:ro"]
  networks = ["backend"]
  extra_hosts = ["db:10.0.0.2"]
  cap_add  = ["NET_ADMIN"]
  ulimits  = { nofile = "65536:65536" }
  docker_options = ["--read-only"]
  post_deploy = ["echo done"]
  keep_releases = 5

  resources {
    limits {
      cpu    = "500m"
      memory = "256Mi"
    }
  }

  logs {
    max_size  = "10m"
    max_files = 3
  }

  release {
    command = ["bin/migrate"]
    timeout = "5m"
  }
}
