deployment "shop" "api" {
  build {
    context    = "./api"
    dockerfile = "Dockerfile.prod"
    args       = { GO_VERSION = "1.22" }
    lang {
      name    = "go"
      version = "1.22"
    }
  }
  network_mode = "host"
}
