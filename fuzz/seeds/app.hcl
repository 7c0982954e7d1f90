# an app is a deployment plus an ingress
app "shop" "web" {
  image = "ghcr.io/acme/web:${TAG:-latest}"
  host  = "web.example.com"
  ports = ["3000"]

  tls {
    enabled  = true
    provider = "letsencrypt"
    email    = "ops@example.com"
  }

  location {
    path  = "/api"
    strip = true
  }

  lb {
    policy   = "round_robin"
    interval = "10s"
  }

  init "migrate" {
    command = ["rails", "db:migrate"]
    timeout = "2m"
    retries = 2
  }
}
