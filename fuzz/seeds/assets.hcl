asset "shop" "conf" {
  nginx   = file("./conf/nginx.conf")
  inline  = "hello ${REGION:-here}"
  remote  = url("https://example.com/app.conf", { timeout = "10s", on_failure = "error" })
  failing = url("https://fail.example.com/x")
  doc     = <<-EOT
    line one ${EMPTY:-}
    $${literal}
    EOT
}

asset "global" {
  ca = "-----BEGIN CERTIFICATE-----"
}

deployment "shop" "web" {
  image   = "nginx"
  volumes = ["${asset.shop.conf.nginx}:/etc/nginx/nginx.conf:ro", "${asset.global.ca}:/ca.pem"]
  depends_on {
    assets = ["shop.conf.inline", "global.ca"]
  }
}
