deployment "shop" "web" {
  image = "${lower("X")}"
  env   = { A = "${A", B = "${", C = "x ${B:-d} $${C} ${D:-}" }
}
