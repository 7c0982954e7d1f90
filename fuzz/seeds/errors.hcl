deployment "shop" "web" {
  imagee   = "x"
  replicas = -1
  ports    = ["not a port"]
  restart  = "sometimes"
  network_mode = "bridge"
  env      = { A = "${UNDEFINED}", B = "${asset.a}", C = "${ref.x}", D = 1 + 2 }
  probes {
    readiness {}
  }
  build {}
}

deployment "a/b" "..x" {}
asset "shop" "x" "y" {}
registry {}
unknownkind "a" "b" {}
top = 1
