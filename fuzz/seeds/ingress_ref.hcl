ingress "shop" "api" {
  host    = "api.example.com"
  service = "web"
  port    = 8080
}

deployment "shop" "web" {
  image = "busybox"
  env = {
    API_URL  = "${ref.ingress.api.url}"
    API_HOST = "${ref.ingresses.api.host}"
    BAD      = "${ref.deployment.web.host}"
  }
}
