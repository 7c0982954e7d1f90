deployment "${SCOPE:-shop}" "${NAME:-web}" {
  image = "busybox:${TAG}"
}

deployment "${CLIMB}" "x" {
  image = "busybox"
}

deployment "shop" "${MARKED:-m}" {
  image = "${LOOKS_INTERPOLATED}${QUOTE}"
}
