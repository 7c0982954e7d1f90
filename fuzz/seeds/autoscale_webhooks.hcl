deployment "shop" "worker" {
  image = "busybox"

  autoscale {
    min           = 1
    max           = 4
    cpu_target    = 70
    cooldown_up   = "30s"
    cooldown_down = "5m"
  }

  on_deploy {
    success {
      url     = "https://hooks.example.com/ok"
      method  = "post"
      headers = { Authorization = "Bearer ${SECRET:-none}" }
      body    = { text = "deployed", n = 1, ratio = 0.25, big = 18446744073709551615, tags = ["a", true, null], nested = { deep = -2 } }
    }
    failure {
      url  = "https://hooks.example.com/fail"
      file = "${asset.shop.hooks.failure}"
    }
  }

  on_probe {
    failure {
      url = "https://hooks.example.com/probe"
    }
  }
}
