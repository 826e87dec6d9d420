# Writes OUTPUT: a C++ file defining `const char* const SYMBOL` (in namespace NAMESPACE) holding
# INPUT's bytes as a raw string literal. Used to embed the chat page into the binary.
file(READ "${INPUT}" content)
string(FIND "${content}" ")KILN_EMBED\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string delimiter )KILN_EMBED\"")
endif()
file(WRITE "${OUTPUT}.tmp" "// Generated from ${INPUT} by cmake/embed_file.cmake; do not edit.\nnamespace ${NAMESPACE} {\nextern const char* const ${SYMBOL};\nconst char* const ${SYMBOL} = R\"KILN_EMBED(${content})KILN_EMBED\";\n}\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
