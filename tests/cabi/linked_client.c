/* A host that links libserving_processor.so (-lserving_processor) instead of dlopen-ing it,
 * compiled against the processor.h recserve installs (`recserve include-path`).
 * Usage: linked_client CONFIG_JSON_FILE REQUEST_FILE REPLY_FILE: prints the status, writes
 * the reply's bytes to REPLY_FILE. */
#include <stdio.h>
#include <stdlib.h>

#include "processor.h"

static char* read_file(const char* path, long* size) {
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char* data = malloc((size_t)*size + 1);
    if (data && fread(data, 1, (size_t)*size, f) != (size_t)*size) {
        free(data);
        data = NULL;
    }
    if (data) data[*size] = '\0';
    fclose(f);
    return data;
}

int main(int argc, char** argv) {
    if (argc != 4) return 2;
    long config_size = 0, request_size = 0;
    char* config = read_file(argv[1], &config_size);
    char* request = read_file(argv[2], &request_size);
    if (!config || !request) return 2;
    int state = -1;
    void* model = initialize("linked", config, &state);
    if (!model || state != 0) return 3;
    void* output = NULL;
    int output_size = 0;
    int status = process(model, request, (int)request_size, &output, &output_size);
    printf("%d\n", status);
    FILE* reply = fopen(argv[3], "wb");
    if (!reply || fwrite(output, 1, (size_t)output_size, reply) != (size_t)output_size) return 4;
    fclose(reply);
    release_buffer(output);
    destroy(model);
    free(config);
    free(request);
    return 0;
}
