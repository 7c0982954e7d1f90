deployment "s" "n" {
  image = "café ${NAME:-€}"
  env = { "Ké" = "\u00e9\n${REGION:-r}" }
}
