deployment "shop" "web" {
  image    = "busybox"
  env_file = ["conf/app.env", "link.env", "up.env", "conf/bad.env", "escape", "missing.env"]
  env      = { PORT = "${PORT}" }
}
