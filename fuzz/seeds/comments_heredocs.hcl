/* block comment ${NOT_INTERPOLATED} */
// line comment ${NOT_INTERPOLATED}
# hash comment "${NOT_INTERPOLATED}"
job "ops" "script" {
  image   = "alpine"
  command = ["sh", "-c", <<EOT
echo "${REGION:-none}" $${HOME}
for x in a b; do echo %%{x}; done
EOT
  ]
  env = {
    "quoted key" = "a \"quoted\" ${EMPTY:-} value" # trailing ${X}
    ESCAPED      = "\\$${NOT_A_VAR}"
    PERCENT      = "%%{literal}"
  }
}
