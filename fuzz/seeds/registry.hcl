registry "ghcr" {
  url      = "ghcr.io"
  username = "${REGISTRY_USER:-bot}"
  token    = "${REGISTRY_TOKEN:-x}"
}

registry "ecr" {
  url    = "123.dkr.ecr.eu-west-1.amazonaws.com"
  helper = "ecr-login"
}
